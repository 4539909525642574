"""DistilBERT as a configuration of the one backbone (no token types, no pooler, its own tensor names):
parity with DistilBertModel / DistilBertForMaskedLM."""
import json

import pytest
import torch

from _families import padded_inputs, randomize, roundtrip

transformers = pytest.importorskip("transformers")
TINY = dict(vocab_size=99, dim=32, n_layers=2, n_heads=4, hidden_dim=37, max_position_embeddings=40)


@pytest.mark.parametrize("arch,key", [("DistilBertModel", "last_hidden_state"), ("DistilBertForMaskedLM", "logits")])
def test_distilbert_parity_and_save_back(arch, key, tmp_path):
    torch.manual_seed(0)
    hf = randomize(getattr(transformers, arch)(transformers.DistilBertConfig(**TINY)))
    ids, mask = padded_inputs(99, 0)
    diff, back, ours = roundtrip(hf, tmp_path, key, key, dict(input_ids=ids, attention_mask=mask), mask)
    assert diff <= 1e-5 and back <= 1e-5, (diff, back)
    backbone = getattr(ours, "backbone", ours)
    assert backbone.embeddings.seg is None and backbone.pooler is None
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert saved["dim"] == 32 and saved["n_layers"] == 2 and saved["architectures"] == [arch]
