"""ModernBERT as a configuration of the one backbone: pre-LN, bias-free, GeGLU, RoPE with a different theta
for global and local layers, global attention every 3rd layer and a ±64 local window in between, run
unpadded. Parity with ModernBertModel / ModernBertForMaskedLM on inputs longer than the window, with padding."""
import json

import pytest
import torch

from _families import padded_inputs, randomize, roundtrip
from attnlab.config import preset
from attnlab.heads import MaskedLM
from attnlab.models.encoder import Encoder

transformers = pytest.importorskip("transformers")
PAD = 0
# the real window (local_attention=128, i.e. ±64) and real thetas; small widths; 4 layers = global, local,
# local, global
TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=24,
            max_position_embeddings=512, pad_token_id=PAD, bos_token_id=1, eos_token_id=2, cls_token_id=1,
            sep_token_id=2)
SEQ = 160  # longer than the ±64 window: local layers must really leave distant tokens out


@pytest.mark.parametrize("unpad", [True, False])
@pytest.mark.parametrize("arch,key", [("ModernBertModel", "last_hidden_state"), ("ModernBertForMaskedLM", "logits")])
def test_modernbert_parity_and_save_back(arch, key, unpad, tmp_path, monkeypatch):
    monkeypatch.setattr(Encoder, "unpad", unpad)
    torch.manual_seed(0)
    hf = randomize(getattr(transformers, arch)(transformers.ModernBertConfig(**TINY)))
    ids, mask = padded_inputs(99, PAD, seq=SEQ)
    mask[1, 100:] = 0  # row 1 keeps 100 real tokens (> window), row 2 keeps 4
    mask[1, :100] = 1
    ids[mask == 0] = PAD
    diff, back, ours = roundtrip(hf, tmp_path, key, key, dict(input_ids=ids, attention_mask=mask), mask)
    assert diff <= 1e-5 and back <= 1e-5, (diff, back)
    backbone = getattr(ours, "backbone", ours)
    assert [backbone._is_local(i) for i in range(4)] == [False, True, True, False]
    assert backbone.config.sliding_window == 65 and backbone.local_rope is not None
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert saved["local_attention"] == 128 and saved["layer_types"][:3] == ["full_attention", "sliding_attention",
                                                                            "sliding_attention"]
    assert saved["rope_parameters"]["sliding_attention"]["rope_theta"] == 10000.0
    assert saved["rope_parameters"]["full_attention"]["rope_theta"] == 160000.0
    assert not {"global_every", "skip_first_attn_norm", "local_rope_theta"} & set(saved)


def _small(**over):
    kw = dict(vocab_size=64, hidden_size=16, num_layers=3, num_heads=2, intermediate_size=16, pad_token_id=0,
              bos_token_id=1, eos_token_id=2)
    return preset("modernbert-base", **{**kw, **over})


def test_local_layers_see_exactly_plus_minus_64():
    model = Encoder(_small(attn_implementation="eager")).eval()
    ids = torch.randint(3, 64, (1, 150))
    with torch.no_grad():
        att = model(input_ids=ids, output_attentions=True).attentions
    dist = (torch.arange(150)[:, None] - torch.arange(150)[None, :]).abs()
    assert (att[0][0] > 0).all()  # layer 0 is global
    for local in att[1:]:
        w = local[0]  # (heads, q, k)
        assert (w[:, dist > 64] == 0).all() and (w[:, dist <= 64] > 0).all()


def test_local_layer_output_ignores_tokens_beyond_the_window():
    cfg = _small(num_layers=1)
    cfg.extra["global_every"] = None  # every layer local
    model = Encoder(cfg).eval()
    ids = torch.randint(3, 64, (1, 150))
    changed = ids.clone()
    changed[0, 0] = 3 if ids[0, 0] != 3 else 4
    with torch.no_grad():
        a, b = model(input_ids=ids).last_hidden_state, model(input_ids=changed).last_hidden_state
    moved = (a - b).abs().amax(-1)[0]
    assert (moved[65:] == 0).all() and (moved[:65] > 0).all()


def test_modernbert_base_preset():
    cfg = preset("modernbert-base")
    assert cfg.max_position_embeddings == 8192 and cfg.position == "rope"  # 8192-token context, no position table
    with torch.device("meta"):
        model = MaskedLM(cfg)
    assert 149_000_000 <= model.num_parameters() <= 150_000_000  # ModernBERT-base: 149M (Warner et al. 2024)
