"""RoBERTa as a configuration of the one backbone: parity with RobertaModel / RobertaForMaskedLM on
padded inputs (right and left padding: positions count non-pad tokens from padding_idx + 1)."""
import json

import pytest
import torch

from _families import padded_inputs, randomize, roundtrip
from attnlab.config import preset
from attnlab.models.encoder import Encoder

transformers = pytest.importorskip("transformers")
PAD = 1
TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=40, type_vocab_size=1, pad_token_id=PAD, bos_token_id=0, eos_token_id=2)


@pytest.mark.parametrize("arch,ours_key,hf_key", [("RobertaModel", "last_hidden_state", "last_hidden_state"),
                                                  ("RobertaForMaskedLM", "logits", "logits")])
def test_roberta_parity_and_save_back(arch, ours_key, hf_key, tmp_path):
    torch.manual_seed(0)
    hf = randomize(getattr(transformers, arch)(transformers.RobertaConfig(**TINY)))
    ids, mask = padded_inputs(99, PAD, left_pad_row=True)
    diff, back, ours = roundtrip(hf, tmp_path, ours_key, hf_key, dict(input_ids=ids, attention_mask=mask), mask)
    assert diff <= 1e-5 and back <= 1e-5, (diff, back)
    assert ours.hf_architecture == arch
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert saved["model_type"] == "roberta" and saved["architectures"] == [arch]
    assert "position_offset" not in saved and saved["type_vocab_size"] == 1


def test_roberta_positions_start_after_padding_idx():
    cfg = preset("roberta-base", vocab_size=50, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    model = Encoder(cfg).eval()
    seen = {}
    model.embeddings.pos.register_forward_hook(lambda m, args, out: seen.update(pos=args[0]))  # returns None
    ids = torch.tensor([[0, 5, 6, 2, 1, 1], [1, 1, 0, 7, 8, 2]])  # right-padded, left-padded
    with torch.no_grad():
        model(input_ids=ids, attention_mask=(ids != 1).long(), unpad=False)
    assert seen["pos"].tolist() == [[2, 3, 4, 5, 1, 1], [1, 1, 2, 3, 4, 5]]
