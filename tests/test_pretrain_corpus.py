"""examples/pretrain_corpus.py's --repeat: an in-domain source written K times is K documents, and with
heldout_mode=tail every copy holds out the same sentences, so no held-out sentence is ever trained on."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from attnlab.data import open_shards, prepare_corpus
from attnlab.tokenizers import train_tokenizer

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("pretrain_corpus", ROOT / "examples" / "pretrain_corpus.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sentences(corpus: Path, split: str) -> list[tuple]:
    return [tuple(int(t) for t in s) for shard in open_shards(corpus, split)
            for d in range(shard.num_documents) for s in shard.document(d)]


def test_repeated_source_is_k_documents_and_its_heldout_tail_is_never_trained_on(tmp_path):
    lines = [f"Review number {w} was {a} and the film felt {b}." for w, a, b in
             zip(["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"],
                 ["good", "bad", "long", "short", "dull", "fun", "slow", "sharp", "warm", "cold"],
                 ["new", "old", "odd", "fine", "flat", "bright", "grim", "light", "dark", "true"])]
    text = _script().repeated_text(lines, 4)
    (tmp_path / "sst.txt").write_text(text, encoding="utf-8")
    tok = train_tokenizer("wordpiece", [tmp_path / "sst.txt"], 200)
    stats = prepare_corpus(tok, [tmp_path / "sst.txt"], tmp_path / "corpus", heldout=0.2, heldout_mode="tail",
                           progress=False)
    assert stats.documents == 4
    train, held = _sentences(tmp_path / "corpus", "train"), _sentences(tmp_path / "corpus", "heldout")
    assert len(train) == 4 * 8 and len(held) == 4 * 2       # the last 2 of 10 sentences, in every copy
    assert len(set(held)) == 2 and not set(held) & set(train)
    assert _script().repeated_text(lines) == "\n".join(lines) + "\n"   # K=1: the file as before
