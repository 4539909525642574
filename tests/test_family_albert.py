"""ALBERT as a configuration of the one backbone: factorized embeddings (E < H), one block shared by all
layers, the SOP head; parity with AlbertModel / AlbertForPreTraining / AlbertForMaskedLM."""
import pytest
import torch
from safetensors.torch import load_file

from _families import padded_inputs, randomize, roundtrip
from attnlab.cli import main
from attnlab.config import ConfigError, preset
from attnlab.heads import PreTraining
from attnlab.models.encoder import Encoder

transformers = pytest.importorskip("transformers")
TINY = dict(vocab_size=99, embedding_size=16, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
            intermediate_size=37, max_position_embeddings=40)


def _inputs():
    ids, mask = padded_inputs(99, 0)
    types = torch.zeros_like(ids)
    types[:, 5:] = 1
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=types), mask


@pytest.mark.parametrize("arch,ours_key,hf_key", [
    ("AlbertModel", "last_hidden_state", "last_hidden_state"),
    ("AlbertModel", "pooler_output", "pooler_output"),
    ("AlbertForMaskedLM", "logits", "logits"),
    ("AlbertForPreTraining", "logits", "prediction_logits"),
    ("AlbertForPreTraining", "nsp_logits", "sop_logits"),
])
def test_albert_parity_and_save_back(arch, ours_key, hf_key, tmp_path):
    torch.manual_seed(0)
    hf = randomize(getattr(transformers, arch)(transformers.AlbertConfig(**TINY)))
    inputs, mask = _inputs()
    diff, back, ours = roundtrip(hf, tmp_path, ours_key, hf_key, inputs, mask)
    assert diff <= 1e-5 and back <= 1e-5, (diff, back)
    layers = (ours.backbone if hasattr(ours, "backbone") else ours).layers
    assert len(layers) == 3 and all(layer is layers[0] for layer in layers)  # one block, three uses
    saved = load_file(str(tmp_path / "ours" / "model.safetensors"))
    assert not any("albert_layers.1" in k or "albert_layer_groups.1" in k for k in saved)


def test_sharing_and_factorization_save_parameters():
    shared = Encoder(preset("albert-base", num_layers=4, vocab_size=1000))
    unshared = Encoder(preset("albert-base", num_layers=4, vocab_size=1000, share_layers=False))
    per_block = sum(p.numel() for p in shared.layers[0].parameters())
    assert unshared.num_parameters() - shared.num_parameters() == 3 * per_block
    wide = Encoder(preset("albert-base", num_layers=4, vocab_size=1000, embedding_size=None))
    assert wide.num_parameters() > shared.num_parameters() and wide.embeddings.project is None


def test_info_shows_the_saving(capsys):
    assert main(["info", "albert-base"]) == 0
    out = capsys.readouterr().out
    # ALBERT-base: 12M parameters against BERT-base's 108M (Lan et al. 2020, Table 1)
    assert "parameters: 11,683,584" in out
    assert "layers: 12 sharing one block, saving 77,966,592" in out
    assert "factorized E=128 → H=768, saving 19,431,168" in out


def test_sop_head_trains_on_swapped_pairs():
    cfg = preset("albert-base", vocab_size=50, hidden_size=32, embedding_size=16, num_layers=2, num_heads=4,
                 intermediate_size=64)
    model = PreTraining(cfg)
    ids = torch.randint(5, 50, (2, 8))
    out = model(input_ids=ids, next_sentence_label=torch.tensor([0, 1]))
    assert out.nsp_logits.shape == (2, 2) and out.loss.item() > 0


def test_unsupported_groups_are_named():
    with pytest.raises(ConfigError, match="num_hidden_groups=2"):
        from attnlab.interop.albert import albert_config_from_hf
        albert_config_from_hf({**TINY, "num_hidden_groups": 2, "model_type": "albert"})
