"""Longformer (Beltagy et al. 2020) as a configuration of the one backbone: sliding window + global tokens
with their own projections. Parity with LongformerModel / LongformerForMaskedLM (with and without
`global_attention_mask`, padded rows), both directions, on every attention backend."""
import json

import pytest
import torch

import attnlab
from _families import padded_inputs, randomize, roundtrip
from attnlab.config import ConfigError
from attnlab.interop.longformer import longformer_config_from_hf

transformers = pytest.importorskip("transformers")
PAD = 1
TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=80, type_vocab_size=1, pad_token_id=PAD, bos_token_id=0, eos_token_id=2,
            attention_window=[6, 6])


def inputs(seq=29):
    ids, mask = padded_inputs(99, PAD, seq=seq, left_pad_row=False)
    glob = torch.zeros_like(ids)
    glob[:, 0] = 1  # [CLS]-like global token in every row
    glob[0, 17] = 1  # and a second one in row 0 only (rows differ in their global count)
    return ids, mask, glob


@pytest.mark.parametrize("arch,ours_key", [("LongformerModel", "last_hidden_state"),
                                           ("LongformerForMaskedLM", "logits")])
def test_longformer_parity_and_save_back(arch, ours_key, tmp_path):
    torch.manual_seed(0)
    hf = randomize(getattr(transformers, arch)(transformers.LongformerConfig(**TINY)))
    ids, mask, glob = inputs()
    feed = dict(input_ids=ids, attention_mask=mask)
    if arch == "LongformerModel":  # the heads take no global_attention_mask (HF's MLM default: none)
        feed["global_attention_mask"] = glob
    diff, back, ours = roundtrip(hf, tmp_path, ours_key, ours_key, feed, mask)
    assert diff <= 1e-5 and back <= 1e-5, (diff, back)
    assert ours.config.sliding_window == 4 and ours.config.global_attention
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert saved["model_type"] == "longformer" and saved["attention_window"] == [6, 6]
    assert "position_offset" not in saved


@pytest.mark.parametrize("impl", ["sdpa", "eager", "tiled"])
def test_every_backend_matches_with_and_without_global_tokens(impl, tmp_path):
    torch.manual_seed(0)
    hf = randomize(transformers.LongformerModel(transformers.LongformerConfig(**TINY)))
    hf.save_pretrained(tmp_path)
    model = attnlab.load(tmp_path)
    ours = attnlab.from_config(model.config.replace(attn_implementation=impl))
    ours.load_state_dict(model.state_dict())
    ours.eval()
    ids, mask, glob = inputs(seq=45)
    real = mask.bool()
    outs = {}
    with torch.no_grad():
        for name, g in (("global", glob), ("local only", None)):
            want = hf(ids, attention_mask=mask, global_attention_mask=g).last_hidden_state
            outs[name] = ours(ids, attention_mask=mask, global_attention_mask=g).last_hidden_state
            assert (want - outs[name])[real].abs().max() <= 1e-5, name
    # a global token's row differs from the purely local model's: the global path really ran
    assert (outs["global"][0, 17] - outs["local only"][0, 17]).abs().max() > 1e-3


def test_unsupported_windows_are_clear_errors():
    with pytest.raises(ConfigError, match="attention_window"):
        longformer_config_from_hf({**TINY, "attention_window": [6, 8]})
    with pytest.raises(ConfigError, match="attention_window"):
        longformer_config_from_hf({**TINY, "attention_window": 5})
    cfg = longformer_config_from_hf(dict(TINY))
    with pytest.raises(ConfigError, match="global_attention"):
        cfg.replace(num_kv_heads=2)
