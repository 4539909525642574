"""Bits per byte beside val loss for attnlab's own causal LMs: a character-level and a byte-level BPE model,
each pretrained for a few steps. Bits per byte = val loss (nats per token) x tokens per byte / ln 2, with
tokens per byte measured on the held-out text; it makes the two tokenizers' losses comparable."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from attnlab.data import open_shards, prepare_corpus
from attnlab.objectives.clm import tokens_per_byte
from attnlab.tokenizers import build_char_tokenizer, load_tokenizer, train_tokenizer
from attnlab.training.pretrain import load_config, pretrain

from _pretrain_utils import one_thread, sample_text

GPT = ["model.model_type=gpt2", "model.causal=true", "model.hidden_size=32", "model.num_layers=2",
       "model.num_heads=2", "model.intermediate_size=64", "model.max_position_embeddings=64",
       "model.norm_placement=pre", "model.embedding_norm=false", "model.final_norm=true", "model.pooler=false",
       "model.type_vocab_size=0", "model.dropout=0.0", "model.attention_dropout=0.0"]


@pytest.fixture(autouse=True)
def _single_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def books(data_dir: Path, tmp_path_factory) -> list[Path]:
    return sorted(sample_text(data_dir, tmp_path_factory.mktemp("bpb") / "text", chars_per_book=5000,
                              books=3).iterdir())


def _pretrain(corpus: Path, out: Path) -> list[dict]:
    pretrain(load_config(None, [f"data.path={corpus}", "data.seq_len=32", "data.batch_size=4",
                                "data.eval_batches=2", "objective.kind=clm", f"train.output_dir={out}",
                                "train.max_steps=4", "train.lr=2e-3", "train.warmup_steps=1", "train.log_every=1",
                                "train.eval_every=2", "train.progress=false", *GPT]))
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "eval_loss" in r]


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_pretrain_logs_bits_per_byte_beside_val_loss(kind, books, tmp_path):
    tok = build_char_tokenizer(books) if kind == "char" else train_tokenizer("bpe", books, 400)
    prepare_corpus(tok, books, tmp_path / "corpus", heldout=0.2, shard_tokens=4000, progress=False)
    ratio = tokens_per_byte(open_shards(tmp_path / "corpus", "heldout"), load_tokenizer(tmp_path / "corpus" / "tokenizer"))
    evals = _pretrain(tmp_path / "corpus", tmp_path / "out")
    assert len(evals) == 2
    for row in evals:
        assert row["eval_bits_per_byte"] == pytest.approx(row["eval_loss"] * ratio / math.log(2), rel=1e-6)  # the log keeps 7 digits
    # the ratio itself, against the books encoded whole: ~1 token per byte for characters (Gutenberg text
    # is nearly all ASCII), well under for BPE
    text = "".join(b.read_text(encoding="utf-8") for b in books)
    direct = len(tok.encode(text, add_special_tokens=False)) / len(text.encode("utf-8"))
    assert ratio == pytest.approx(direct, rel=0.05)
    assert (0.95 < ratio <= 1.0) if kind == "char" else (0.2 < ratio < 0.6)


def test_tokens_per_byte_counts_utf8_bytes_not_characters(tmp_path):
    """'é' is one character and one char-level token but two UTF-8 bytes: 'aé' is 2 tokens per 3 bytes."""
    (tmp_path / "t.txt").write_text("aé" * 400, encoding="utf-8")
    tok = build_char_tokenizer([tmp_path / "t.txt"])
    prepare_corpus(tok, [tmp_path / "t.txt"], tmp_path / "corpus", raw=True, documents="file", heldout=0.0,
                   progress=False)
    assert tokens_per_byte(open_shards(tmp_path / "corpus", "train"), tok) == pytest.approx(2 / 3)
