"""Byte-level models: a byte tokenizer whose ids equal transformers' ByT5Tokenizer() on every SST-2 sentence,
a ByT5-shaped preset that T5 checkpoints express, and leaky_relu as an activation switch."""
from __future__ import annotations

import csv
import json

import pytest
import torch

import attnlab
from attnlab.config import preset
from attnlab.data.root import data_root
from attnlab.nn.feedforward import FeedForward
from attnlab.tokenizers import build_byte_tokenizer

transformers = pytest.importorskip("transformers")


def _sentences() -> list[str]:
    from pathlib import Path
    root = (data_root() or Path("ATTNLAB_DATA unset")) / "glue" / "SST-2"
    if not (root / "train.tsv").exists():
        pytest.skip(f"SST-2 is not under {root}")
    out = []
    for split in ("train.tsv", "dev.tsv"):  # this copy of SST-2 has train.tsv only (67,349 sentences)
        if (root / split).exists():
            with open(root / split, encoding="utf-8", newline="") as fh:
                out += [row["sentence"] for row in csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)]
    return out


def test_byte_ids_equal_byt5_tokenizer_on_every_sst2_sentence():
    sentences = _sentences()
    assert len(sentences) > 60000
    hf, ours = transformers.ByT5Tokenizer(), build_byte_tokenizer()
    want = hf(sentences)["input_ids"]
    got = ours(sentences, truncation=False)["input_ids"]
    bad = [s for s, a, b in zip(sentences, want, got) if a != b]
    assert not bad, f"{len(bad)} sentences differ, e.g. {bad[0]!r}"
    assert len(ours) == len(hf) == 384


def test_byte_tokenizer_edges_pairs_decode_and_save(tmp_path):
    hf, ours = transformers.ByT5Tokenizer(), build_byte_tokenizer()
    for text in ("héllo wörld ✓ 🙂", " a </s> b ", "x<pad>y", "<extra_id_0> z <extra_id_3>", "", "tab\tnew\nline"):
        assert ours(text)["input_ids"] == hf(text)["input_ids"], text
    assert ours("ab", "cd")["input_ids"] == hf("ab", "cd")["input_ids"] == [100, 101, 1, 102, 103, 1]
    text = "naïve café 日本語"
    assert ours.decode(ours(text)["input_ids"]) == text
    assert ours.pad_token_id == 0 and ours.eos_token_id == 1 and ours.unk_token_id == 2
    batch = ours(["a", "abc"], padding=True, return_tensors="pt")
    assert batch["input_ids"].tolist() == [[100, 1, 0, 0], [100, 101, 102, 1]]
    path = ours.save(tmp_path / "tok")
    again = attnlab.load_tokenizer(path)
    assert again(text)["input_ids"] == ours(text)["input_ids"]
    assert attnlab.load_tokenizer("byte")(text)["input_ids"] == ours(text)["input_ids"]


def test_byt5_preset_matches_transformers_t5_and_runs_on_bytes(tmp_path):
    cfg = preset("byt5-small")
    hf_cfg = transformers.T5Config(vocab_size=384, d_model=1472, d_ff=3584, d_kv=64, num_heads=6, num_layers=12,
                                   num_decoder_layers=4, feed_forward_proj="gated-gelu", tie_word_embeddings=False)
    with torch.device("meta"):
        hf_meta = transformers.T5ForConditionalGeneration(hf_cfg)
        want = sum(p.numel() for p in hf_meta.parameters())
        got = attnlab.from_config(cfg).num_parameters()
    if hf_meta.lm_head.weight is hf_meta.shared.weight:  # transformers 5 builds T5 tied whatever the config
        want += 384 * 1472                                 # says; ByT5 (v1.1) has an output matrix of its own
    assert got == want == 299_637_760
    # a tiny model of the same shape family: bytes in, a T5 checkpoint out that transformers loads equal
    tok = build_byte_tokenizer()
    torch.manual_seed(0)
    small = attnlab.from_config(preset("byt5-small", hidden_size=32, num_heads=2, head_dim=16, intermediate_size=64,
                                       num_layers=2, extra={"num_decoder_layers": 1, "decoder_start_token_id": 0,
                                                            "scale_decoder_outputs": False})).eval()
    enc = tok(["byte level", "models"], padding=True, return_tensors="pt")
    labels = tok(["ok", "fine"], padding=True, return_tensors="pt")["input_ids"]
    path = small.save(tmp_path / "byt5")
    assert json.loads((path / "config.json").read_text())["vocab_size"] == 384
    hf = transformers.T5ForConditionalGeneration.from_pretrained(path).eval()
    with torch.no_grad():
        a = small(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], labels=labels).logits
        b = hf(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], labels=labels).logits
    assert (a - b).abs().max().item() <= 1e-5


def test_leaky_relu_switch_keeps_a_gradient_below_zero_and_matches_transformers_bert(tmp_path):
    cfg = preset("bert-tiny", activation="leaky_relu", hidden_size=8, intermediate_size=8, num_heads=2)
    ffn = FeedForward(cfg)
    x = torch.randn(4, 8, requires_grad=True)
    h = ffn.up(x)
    assert torch.allclose(ffn(x), ffn.down(torch.where(h > 0, h, 0.01 * h)))
    with torch.no_grad():  # all pre-activations negative: ReLU would pass no gradient at all
        ffn.up.bias.fill_(-100.0)
    ffn(x).sum().backward()
    assert x.grad.abs().sum() > 0
    torch.manual_seed(0)
    hf = transformers.BertModel(transformers.BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1,
                                                        num_attention_heads=2, intermediate_size=32,
                                                        hidden_act="leaky_relu")).eval()
    hf.save_pretrained(tmp_path / "hf")
    ours = attnlab.load(tmp_path / "hf")
    assert ours.config.activation == "leaky_relu"
    ids = torch.randint(0, 100, (2, 7))
    with torch.no_grad():
        assert (ours(ids).last_hidden_state - hf(ids).last_hidden_state).abs().max().item() <= 1e-5
    back = transformers.BertModel.from_pretrained(ours.save(tmp_path / "ours")).eval()
    with torch.no_grad():
        assert (ours(ids).last_hidden_state - back(ids).last_hidden_state).abs().max().item() <= 1e-5
