"""`attnlab info --explain`: the walkthrough's numbers are the model's (parameters counted on the module,
matmul FLOPs measured by torch's FLOP counter, layer kinds as the Encoder decides them)."""
from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import attnlab
from attnlab.cli import main
from attnlab.nn import Block
from attnlab.viz.explain import build_on_meta, count
from attnlab.viz.walkthrough import explain_config, explain_model, format_explanation

CONFIGS = {
    "bert-base": dict(),
    "gqa-decoder": dict(causal=True, num_kv_heads=4, position="rope", norm="rmsnorm", activation="swiglu",
                        norm_placement="pre", bias=False),
    "mqa": dict(causal=True, num_kv_heads=1),
    "t5-bias": dict(position="relative_bias", attention_scale=1.0, activation="relu"),
    "modernbert-like": dict(sliding_window=16, extra={"global_every": 3}, activation="geglu", bias=False,
                            norm_placement="pre"),
    "deberta": dict(position="none", disentangled_attention=["p2c", "c2p"], position_buckets=32, share_att_key=False),
    "deberta-v3": dict(position="none", disentangled_attention=["p2c", "c2p"], position_buckets=32, share_att_key=True,
                       relative_embedding_norm=True),
}


def config(name: str, **more):
    return attnlab.preset("bert-base", **{**CONFIGS[name], **more})


@pytest.mark.parametrize("name", CONFIGS)
def test_step_parameters_add_up_to_one_block(name):
    cfg = config(name)
    block = build_on_meta(Block, cfg)
    for kind in explain_config(cfg, 64).kinds:
        assert kind.params == count(block), kind.name


@pytest.mark.parametrize("name", CONFIGS)
def test_totals_are_the_models(name):
    model = build_on_meta(attnlab.Encoder, config(name))
    ex = explain_model(model, 128)
    assert ex.total_params == count(model)
    assert ex.layer_params == sum(k.params * len(k.layers) for k in ex.kinds)
    assert ex.embedding_params + ex.layer_params + ex.other_params == ex.total_params
    assert sum(len(k.layers) for k in ex.kinds) == 12


@pytest.mark.parametrize("name", ["bert-base", "gqa-decoder", "mqa", "modernbert-like"])
def test_matmul_flops_match_torchs_counter(name):
    """The matmul FLOPs of the steps equal what torch counts in one block's forward (small sizes)."""
    cfg = config(name, hidden_size=64, num_heads=4, num_kv_heads=CONFIGS[name].get("num_kv_heads") and 2,
                 intermediate_size=128, attn_implementation="eager")
    n = 24
    block = Block(cfg).eval()
    x = torch.randn(1, n, cfg.hidden_size)
    rope = attnlab.Encoder(cfg).rope(torch.arange(n)[None]) if cfg.position == "rope" else None
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        block(x, rope=rope, need_weights=True)
    h, d, dh = cfg.num_heads, cfg.hidden_size, cfg.dim_head
    elementwise = 5 * h * n * n + 2 * 8 * n * d + (3 * n * (h + cfg.kv_heads) * dh if rope is not None else 0)
    for kind in explain_config(cfg, n).kinds:
        assert kind.flops - elementwise == counter.get_total_flops(), kind.name


def test_layer_kinds_follow_the_encoder():
    cfg = config("modernbert-like")
    kinds = explain_config(cfg, 256).kinds
    assert [k.layers for k in kinds] == [[0, 3, 6, 9], [1, 2, 4, 5, 7, 8, 10, 11]]
    encoder = build_on_meta(attnlab.Encoder, cfg)
    assert [i for i in range(12) if encoder._is_local(i)] == kinds[1].layers
    assert "local" in kinds[1].name and "±15" in kinds[1].steps[2].text
    assert "local" not in kinds[0].steps[2].text


def test_activation_memory_grows_with_the_square_of_the_length():
    cfg = config("bert-base")
    a, b = explain_config(cfg, 256).kinds[0], explain_config(cfg, 512).kinds[0]
    scores = [s for s in a.steps if s.text.startswith("scores")][0]
    assert scores.activations == 2 * 12 * 256 * 256
    assert [s for s in b.steps if s.text.startswith("scores")][0].activations == 4 * scores.activations
    assert a.activations == 3 * 256 * 768 + 2 * 12 * 256 * 256 + 256 * 768 + 4 * 256 * 768 + 2 * 256 * 3072


def test_kv_cache_of_a_gqa_decoder():
    ex = explain_model(build_on_meta(attnlab.Encoder, config("gqa-decoder")), 1024, bytes_per=2)
    assert ex.kv_cache == 2 * 12 * 1024 * 4 * 64
    text = format_explanation(ex)
    assert "KV cache when generating" in text and "12.0 MiB" in text and "3× less" in text
    assert "decoder layer (causal), GQA 12:4" in text


@pytest.mark.parametrize("preset,total", [("bert-base", "109,482,240"), ("bert-large", "335,141,888")])
def test_cli_explain(preset, total, capsys):
    assert main(["info", preset]) == 0
    assert f"parameters: {total}" in capsys.readouterr().out
    assert main(["info", preset, "--explain", "--seq-len", "256"]) == 0
    out = capsys.readouterr().out
    assert f"parameters: {total}" in out and f"= {total}" in out
    assert "layer type A: encoder layer (bidirectional)" in out and "activation memory" in out


def test_cli_explain_any_config(capsys):
    assert main(["info", "bert-base", "--explain", "--set", "sliding_window=64", "--set", "extra.global_every=3",
                 "--set", "causal=true", "--set", "num_kv_heads=2"]) == 0
    out = capsys.readouterr().out
    assert "global attention — layers 0, 3, 6, 9 (4 of 12)" in out
    assert "causal and local: each token sees itself and 63 earlier tokens" in out
    assert main(["info", "bert-base", "--set", "num_kv_heads=5"]) == 1
    assert "num_kv_heads=5 does not divide num_heads=12" in capsys.readouterr().err
    assert main(["info", "bert-base", "--set", "heads"]) == 1
    assert "expected KEY=VALUE" in capsys.readouterr().err


@pytest.mark.parametrize("preset", ["transformer-base", "t5-small"])
def test_encoder_decoder_walks_both_stacks_through(preset):
    """An encoder-decoder has two layer kinds: the encoder's, and the decoder's with cross-attention; their
    parameters are the blocks' and the FLOP totals count both stacks."""
    from attnlab.models.seq2seq import Seq2SeqLM
    cfg = attnlab.preset(preset)
    model = build_on_meta(Seq2SeqLM, cfg)
    ex = explain_model(model, 64)
    enc, dec = ex.kinds
    assert enc.params == count(model.encoder.layers[0]) and dec.params == count(model.decoder.layers[0])
    assert len(enc.layers) == len(model.encoder.layers) and len(dec.layers) == len(model.decoder.layers)
    assert ex.layer_params == enc.params * len(enc.layers) + dec.params * len(dec.layers)
    assert ex.embedding_params + ex.layer_params + ex.other_params == ex.total_params == count(model)
    assert ex.layer_flops == enc.flops * len(enc.layers) + dec.flops * len(dec.layers)
    assert any(s.text.startswith("cross-attention") for s in dec.steps)
    assert "layer type B: decoder stack" in format_explanation(ex)


def test_cross_attention_flops_match_torchs_counter():
    """A decoder block's matmul FLOPs (self-attention, cross-attention over a source of another length,
    FFN) equal what torch counts."""
    from attnlab.nn.attention import AttentionMask
    from attnlab.viz.explain import cross_attention_steps, layer_walkthrough
    cfg = attnlab.preset("transformer-base", hidden_size=64, num_heads=4, intermediate_size=128,
                         attn_implementation="eager").replace(causal=True)
    n, m = 12, 20
    block = Block(cfg, cross_attention=True).eval()
    x, memory = torch.randn(1, n, 64), torch.randn(1, m, 64)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        block(x, AttentionMask.build(None, n, n, causal=True), memory=memory, need_weights=True)
    steps = layer_walkthrough(cfg, n) + cross_attention_steps(cfg, n, m)
    elementwise = 5 * 4 * n * n + 5 * 4 * n * m + 3 * 8 * n * 64
    assert sum(s.flops for s in steps) - elementwise == counter.get_total_flops()
