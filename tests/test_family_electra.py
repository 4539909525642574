"""ELECTRA as a configuration of the one backbone: the discriminator (ElectraForPreTraining, RTD head)
and the generator (ElectraForMaskedLM, predicting in embedding space through a projection)."""
import pytest
import torch

from _families import padded_inputs, randomize, roundtrip
from attnlab.config import preset
from attnlab.heads import ReplacedTokenDetection

transformers = pytest.importorskip("transformers")
DISCRIMINATOR = dict(vocab_size=99, embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=37, max_position_embeddings=40)
# the paper's generator is narrower than its embeddings (§3.2: generator 1/4 of the discriminator's size)
GENERATOR = dict(DISCRIMINATOR, hidden_size=8, num_attention_heads=2, intermediate_size=16)


def _inputs():
    ids, mask = padded_inputs(99, 0)
    types = torch.zeros_like(ids)
    types[:, 6:] = 1
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=types), mask


@pytest.mark.parametrize("arch,cfg", [("ElectraForPreTraining", DISCRIMINATOR), ("ElectraForMaskedLM", GENERATOR),
                                      ("ElectraForMaskedLM", DISCRIMINATOR)])
def test_electra_parity_and_save_back(arch, cfg, tmp_path):
    torch.manual_seed(0)
    hf = randomize(getattr(transformers, arch)(transformers.ElectraConfig(**cfg)))
    inputs, mask = _inputs()
    diff, back, ours = roundtrip(hf, tmp_path, "logits", "logits", inputs, mask)
    assert diff <= 1e-5 and back <= 1e-5, (diff, back)
    assert ours.hf_architecture == arch and ours.backbone.embeddings.project is not None


def test_discriminator_loss_matches_transformers(tmp_path):
    torch.manual_seed(0)
    hf = randomize(transformers.ElectraForPreTraining(transformers.ElectraConfig(**DISCRIMINATOR)))
    hf.save_pretrained(tmp_path)
    import attnlab
    ours = attnlab.load(tmp_path)
    inputs, _ = _inputs()
    labels = (torch.rand(inputs["input_ids"].shape, generator=torch.Generator().manual_seed(3)) < 0.2).long()
    with torch.no_grad():
        a = ours(**inputs, labels=labels).loss
        b = hf(**inputs, labels=labels).loss
    assert abs(a.item() - b.item()) <= 1e-5


def test_electra_small_preset_counts():
    model = ReplacedTokenDetection(preset("electra-small"))
    # ELECTRA-small discriminator: 14M parameters (Clark et al. 2020, Table 1)
    assert 13_000_000 < model.num_parameters() < 14_500_000
