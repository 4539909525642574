"""DeBERTa-v2/v3 (issue 23): disentangled attention as switches of the one encoder, transformers parity both
directions, the three attention paths equal, log buckets equal DeBERTa's, and DeBERTa-v3's RTD recipe with
gradient-disentangled embedding sharing."""
from pathlib import Path

import numpy as np
import pytest
import torch

import attnlab
from _families import max_diff, padded_inputs, randomize, roundtrip
from _pretrain_utils import one_thread, train_losses
from attnlab.config import ConfigError, ModelConfig, preset
from attnlab.nn.disentangled import log_bucket, relative_index
from attnlab.objectives.electra import Electra, electra_collate, electra_loss, generator_config
from attnlab.objectives.mlm import IGNORE, Vocab

transformers = pytest.importorskip("transformers")
REPO = Path(__file__).resolve().parents[1]
V = 99
# DeBERTa-v3's switches at toy size: 2 x 8 log buckets up to 32, so that the 20-token inputs below reach
# the log-spaced buckets; shared position keys; a LayerNorm on the position table; no absolute positions
V3 = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
          max_position_embeddings=64, relative_attention=True, position_buckets=8, max_relative_positions=32,
          pos_att_type="p2c|c2p", share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False,
          type_vocab_size=0, layer_norm_eps=1e-7)
# DeBERTa (v1 layout in the v2 classes): separate pos_key_proj / pos_query_proj, no buckets (distances clamp
# at 6), absolute positions and segments in the input too, no norm on the table
V1 = dict(V3, share_att_key=False, position_buckets=-1, max_relative_positions=6, norm_rel_ebd="none",
          position_biased_input=True, type_vocab_size=2)
CONFIGS = {"v3": V3, "v1": V1, "c2p": dict(V3, pos_att_type=["c2p"]), "lm_predictions": dict(V3, legacy=False)}
OUTPUT = {"DebertaV2Model": "last_hidden_state"}


@pytest.fixture(autouse=True)
def _single_thread():
    with one_thread():
        yield


def _inputs(segments: bool = False):
    ids, mask = padded_inputs(V, 0, seq=20)
    inputs = dict(input_ids=ids, attention_mask=mask)
    if segments:
        inputs["token_type_ids"] = (torch.arange(20) >= 9).long().expand(3, 20)
    return inputs, mask


def _hf(arch: str, cfg: dict, **extra):
    torch.manual_seed(0)
    return randomize(getattr(transformers, arch)(transformers.DebertaV2Config(**cfg, **extra)))


@pytest.mark.parametrize("name,arch", [
    ("v3", "DebertaV2Model"), ("v3", "DebertaV2ForMaskedLM"), ("v3", "DebertaV2ForSequenceClassification"),
    ("v3", "DebertaV2ForTokenClassification"), ("v1", "DebertaV2ForMaskedLM"),
    ("v1", "DebertaV2ForSequenceClassification"), ("c2p", "DebertaV2ForMaskedLM"),
    ("lm_predictions", "DebertaV2ForMaskedLM")])
def test_parity_and_save_back(name, arch, tmp_path):
    """transformers' weights -> attnlab: same outputs on padded inputs; attnlab's save -> transformers loads it
    with no missing or unused tensor and the same outputs (fp32, <= 1e-5)."""
    hf = _hf(arch, CONFIGS[name])
    inputs, mask = _inputs(segments=name == "v1")
    key = OUTPUT.get(arch, "logits")
    diff, back, ours = roundtrip(hf, tmp_path, key, key, inputs, mask)
    assert diff <= 1e-5 and back <= 1e-5, (diff, back)
    assert ours.hf_architecture == arch
    if name == "lm_predictions":  # legacy=false: the head is written under transformers' newer names
        from safetensors import safe_open
        with safe_open(tmp_path / "ours" / "model.safetensors", "pt") as f:
            assert {"lm_predictions.lm_head.dense.weight", "lm_predictions.lm_head.bias"} <= set(f.keys())


def test_log_buckets_equal_debertas():
    """Distances up to b/2 stay exact, farther ones share b/2 - 1 log-spaced buckets per side up to
    max_relative_positions: exactly DeBERTa's buckets (ceil() makes off-by-one easy), for v3's 256/512."""
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position
    rel = torch.arange(-3000, 3001)
    for buckets, top in ((256, 512), (8, 32)):
        ours = log_bucket(rel, buckets, top)
        assert torch.equal(ours, make_log_bucket_position(rel, buckets, top).long())
        near = rel.abs() <= buckets // 2
        assert torch.equal(ours[near], rel[near]) and torch.equal(ours, -ours.flip(0))  # exact, odd
        assert (ours.diff() >= 0).all() and ours[rel.abs() < top].abs().max() == buckets - 1
    index = relative_index(20, 8, 8, 32)
    assert index[0, 0] == 8 and index[19, 0] == 15 and index[0, 19] == 1  # delta = i - j, bucketed, + span


def test_attention_paths_and_weights_agree(tmp_path):
    """sdpa, the explicit path and the tiled path give the same outputs, and the explicit path's weights
    (c2c + c2p + p2c before the softmax) equal transformers' attention probabilities on real queries."""
    hf = _hf("DebertaV2Model", V3)
    hf.save_pretrained(tmp_path)
    inputs, mask = _inputs()
    with torch.no_grad():
        want = hf(**inputs, output_attentions=True)
        outs = {}
        for impl in ("sdpa", "eager", "tiled"):
            model = attnlab.load(tmp_path)
            model = attnlab.from_config(model.config.replace(attn_implementation=impl))
            model.load_state_dict(attnlab.load(tmp_path).state_dict())
            outs[impl] = model.eval()(**inputs, output_attentions=impl == "eager")
    for impl, out in outs.items():
        assert max_diff(out.last_hidden_state, want.last_hidden_state, mask) <= 1e-5, impl
    real = mask.bool()[:, None, :, None] & mask.bool()[:, None, None, :]
    for ours, theirs in zip(outs["eager"].attentions, want.attentions):
        assert ours.shape == theirs.shape and (ours - theirs)[real.expand_as(ours)].abs().max() <= 1e-5


def test_mlm_loss_and_gradients_match_transformers(tmp_path):
    """Training sees the same numbers: the MLM loss and the gradients reaching the relative-position table
    and the position projections equal transformers' (v1 layout: separate pos_key/pos_query projections)."""
    hf = _hf("DebertaV2ForMaskedLM", V1)
    hf.save_pretrained(tmp_path)
    ours = attnlab.load(tmp_path)
    inputs, _ = _inputs(segments=True)
    labels = torch.where(torch.rand(inputs["input_ids"].shape, generator=torch.Generator().manual_seed(2)) < 0.3,
                         inputs["input_ids"], torch.full_like(inputs["input_ids"], IGNORE))
    labels[inputs["attention_mask"] == 0] = IGNORE
    a, b = ours(**inputs, labels=labels).loss, hf(**inputs, labels=labels).loss
    assert abs(a.item() - b.item()) <= 1e-5
    a.backward()
    b.backward()
    enc, layer = hf.deberta.encoder, hf.deberta.encoder.layer[1].attention.self
    pairs = [(ours.backbone.rel_positions.embeddings.weight, enc.rel_embeddings.weight),
             (ours.backbone.layers[1].attn.rel.pos_k.weight, layer.pos_key_proj.weight),
             (ours.backbone.layers[1].attn.rel.pos_q.weight, layer.pos_query_proj.weight),
             (ours.backbone.layers[1].attn.q.weight, layer.query_proj.weight)]
    for mine, theirs in pairs:
        assert mine.grad.abs().max() > 0 and (mine.grad - theirs.grad).abs().max() <= 1e-5


def test_presets_count_like_transformers():
    """deberta-v3-base: 184M parameters (86M backbone + 98M embeddings of the 128k vocabulary), as
    transformers counts its DebertaV2Model."""
    for name, sizes in (("deberta-v3-base", (768, 12, 3072)), ("deberta-v3-xsmall", (384, 6, 1536))):
        hidden, heads, inner = sizes
        cfg = dict(V3, vocab_size=128100, hidden_size=hidden, num_hidden_layers=12, num_attention_heads=heads,
                   intermediate_size=inner, max_position_embeddings=512, position_buckets=256,
                   max_relative_positions=-1)
        with torch.device("meta"):
            ours = attnlab.from_config(preset(name))
            theirs = transformers.DebertaV2Model(transformers.DebertaV2Config(**cfg))
        assert ours.num_parameters() == sum(p.numel() for p in theirs.parameters())
    assert attnlab.from_config(preset("deberta-v3-base")).num_parameters() == 183_831_552


def test_a_model_built_here_saves_for_transformers(tmp_path):
    """From a preset (no checkpoint): attnlab's save is a DebertaV2ForSequenceClassification directory that
    transformers loads with the same logits; the classifier reads the GELU ContextPooler."""
    from attnlab.heads import SequenceClassification
    torch.manual_seed(0)
    cfg = _v3_tiny(vocab_size=V, extra={"head_pooler": True, "pooler_activation": "gelu", "num_labels": 3})
    ours = randomize(SequenceClassification(cfg))
    # the pooler is the head's, not the backbone's
    assert ours.backbone.pooler is not None and attnlab.from_config(cfg).pooler is None
    attnlab.save(ours, tmp_path)
    theirs = transformers.DebertaV2ForSequenceClassification.from_pretrained(tmp_path).eval()
    inputs, _ = _inputs()
    with torch.no_grad():
        assert (ours(**inputs).logits - theirs(**inputs).logits).abs().max() <= 1e-5
    c = theirs.config
    assert c.position_buckets == 8 and c.share_att_key and not c.position_biased_input


def test_unsupported_configs_name_the_key(tmp_path):
    import json
    for bad, key in ((dict(conv_kernel_size=3), "conv_kernel_size"), (dict(embedding_size=16), "embedding_size"),
                     (dict(pos_att_type=["c2c"]), "pos_att_type"), (dict(position_buckets="8"), "position_buckets")):
        (tmp_path / "config.json").write_text(json.dumps({**V3, "model_type": "deberta-v2", **bad}))
        with pytest.raises(ConfigError, match=key):
            attnlab.load(tmp_path)
    with pytest.raises(ConfigError, match="disentangled_attention"):
        ModelConfig(disentangled_attention=["c2c"])
    for bad in (dict(causal=True), dict(num_kv_heads=1)):
        with pytest.raises(ConfigError, match="disentangled_attention"):
            ModelConfig(disentangled_attention=["c2p"], **bad)
    with pytest.raises(ConfigError, match="max_relative_positions"):
        ModelConfig(disentangled_attention=["c2p"], position_buckets=256, max_position_embeddings=64)


# ------------------------------------------------------------------------------ DeBERTa-v3: RTD with GDES
SPECIAL = np.array([0, 1, 2, 3])  # pad, cls, sep, mask


def _v3_tiny(**over) -> ModelConfig:
    return preset("deberta-v3-xsmall", **{**dict(vocab_size=40, hidden_size=32, num_layers=2, num_heads=4,
                                                 intermediate_size=64, max_position_embeddings=32, position_buckets=8,
                                                 dropout=0.0, attention_dropout=0.0), **over})


def _batch(seed: int, n: int = 8, t: int = 14):
    rng = np.random.default_rng(seed)
    examples = [np.concatenate([[1], rng.integers(4, 12, size=int(rng.integers(6, t - 1))), [2]]) for _ in range(n)]
    return electra_collate(examples, Vocab(40, 3, SPECIAL, None), rng)


def test_gdes_keeps_rtd_gradients_out_of_the_generator_embeddings():
    """DeBERTa-v3 §3.2: E_D = sg(E_G) + E_Δ. The discriminator's loss reaches E_Δ only, the generator's loss
    E_G only; with ELECTRA's plain sharing the discriminator's loss reaches the one shared table."""
    torch.manual_seed(0)
    cfg = _v3_tiny()
    gen_cfg = generator_config(cfg, divisor=1, depth=0.5)
    assert (gen_cfg.hidden_size, gen_cfg.num_layers) == (cfg.hidden_size, 1)  # same width, half depth
    model = Electra(cfg, gen_cfg, sharing="gdes")
    e_g, e_d = model.generator.backbone.embeddings.tok, model.discriminator.backbone.embeddings.tok
    assert e_g is not e_d and not e_d.weight.any() and model.generator.mlm.decoder.weight is e_g.weight
    batch = _batch(0)
    out = model(**batch)
    disc = model.discriminator(input_ids=out["corrupted"], attention_mask=batch.get("attention_mask"),
                               labels=out["replaced"])
    disc.loss.backward()
    assert e_g.weight.grad is None and e_d.weight.grad.abs().sum() > 0
    e_d.weight.grad = None
    model.generator(**{k: v for k, v in batch.items() if k != "labels"}, labels=batch["labels"]).loss.backward()
    assert e_d.weight.grad is None and e_g.weight.grad.abs().sum() > 0
    shared = Electra(cfg, gen_cfg)  # ELECTRA's sharing, for contrast
    out = shared(**batch)
    shared.discriminator(input_ids=out["corrupted"], labels=out["replaced"]).loss.backward()
    assert shared.generator.backbone.embeddings.tok.weight.grad.abs().sum() > 0


def test_deberta_v3_rtd_trains_and_exports(tmp_path):
    """The v3 recipe end to end at toy size: the loss falls, the export's discriminator embeddings are
    E_G + E_Δ, and the generator is a DebertaV2ForMaskedLM that transformers loads with the same logits."""
    from attnlab.heads import ReplacedTokenDetection
    torch.manual_seed(0)
    model = Electra(_v3_tiny(), generator_config(_v3_tiny(), divisor=1, depth=0.5), sharing="gdes")
    fixed = [_batch(i) for i in range(4)]
    losses, _ = train_losses(model, electra_loss, fixed, 16)
    assert np.mean(losses[-4:]) < 0.8 * np.mean(losses[:4]), losses
    e_g = model.generator.backbone.embeddings.tok.weight.detach().clone()
    e_delta = model.discriminator.backbone.embeddings.tok.weight.detach().clone()
    assert e_delta.abs().max() > 0
    model.save(tmp_path)
    assert torch.equal(model.discriminator.backbone.embeddings.tok.weight, e_delta)  # saving left training state alone
    disc = attnlab.load(tmp_path)
    assert isinstance(disc, ReplacedTokenDetection)
    assert torch.allclose(disc.backbone.embeddings.tok.weight, e_g + e_delta)
    ids = fixed[0]["input_ids"]
    with torch.no_grad():
        assert torch.allclose(disc(input_ids=ids).logits, model.discriminator(input_ids=ids).logits, atol=1e-5)
        gen = transformers.DebertaV2ForMaskedLM.from_pretrained(tmp_path / "generator").eval()
        assert (gen(input_ids=ids).logits - model.generator(input_ids=ids).logits).abs().max() <= 1e-5


def test_shipped_deberta_v3_recipe_builds(data_dir):
    from attnlab.objectives import build_objective
    from attnlab.tokenizers import load_tokenizer
    from attnlab.training.pretrain import build_model_config, load_config
    cfg = load_config(REPO / "configs" / "pretrain-deberta-v3-mini.yaml")
    tok = load_tokenizer(data_dir / "vocab" / "bert-base-uncased")
    model_cfg = build_model_config(cfg.model, tok, cfg.data.seq_len)
    model = build_objective(cfg.objective, tok, cfg.data.seq_len).model_class(model_cfg)
    assert isinstance(model, Electra) and model.sharing == "gdes" and model_cfg.disentangled_attention
    assert model.generator.config.num_layers * 2 == model_cfg.num_layers
    assert model.generator.config.hidden_size == model_cfg.hidden_size


def test_gdes_checkpoint_resumes_with_its_delta(tmp_path):
    """A Trainer checkpoint of the GDES pair reloads into a fresh pair with E_G, E_Δ and the tied generator
    head as they were (the fresh pair's zero E_Δ is overwritten, not kept)."""
    from attnlab.interop.native import load_model_weights
    from attnlab.training import Trainer, TrainArgs
    from attnlab.training.checkpoint import list_checkpoints
    torch.manual_seed(0)
    def build():
        return Electra(_v3_tiny(), generator_config(_v3_tiny(), divisor=1, depth=0.5), sharing="gdes")
    model = build()
    args = TrainArgs(output_dir=str(tmp_path / "run"), max_steps=3, lr=1e-2, log_every=3, save_every=3, progress=False)
    Trainer(model, args, [_batch(i) for i in range(2)], loss_fn=electra_loss).train()
    again = build()
    load_model_weights(again, list_checkpoints(tmp_path / "run")[-1] / "model")
    assert again.discriminator.backbone.embeddings.tok.weight.abs().max() > 0
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    assert again.generator.mlm.decoder.weight is again.generator.backbone.embeddings.tok.weight
    ids = _batch(5)["input_ids"]
    with torch.no_grad():
        assert torch.equal(again.discriminator(input_ids=ids).logits, model.discriminator(input_ids=ids).logits)
