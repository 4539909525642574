"""The switches of ModelConfig: each builds, runs, and does what the notes say it does."""
import itertools

import pytest
import torch
import torch.nn.functional as F

from attnlab.config import ModelConfig
from attnlab.models import Encoder
from attnlab.nn import Block, FeedForward


def tiny(**kw):
    base = dict(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=48,
                max_position_embeddings=64, dropout=0.0, attention_dropout=0.0)
    return ModelConfig(**{**base, **kw})


@pytest.mark.parametrize("position,norm,placement,activation,bias", list(itertools.product(
    ["learned", "sinusoidal", "rope", "relative_bias", "none"], ["layernorm", "rmsnorm"], ["post", "pre"],
    ["relu", "gelu", "gelu_tanh", "geglu", "swiglu"], [True, False]))[::7])
def test_every_switch_combination_runs_and_sdpa_equals_eager(position, norm, placement, activation, bias):
    torch.manual_seed(0)
    cfg = tiny(position=position, norm=norm, norm_placement=placement, activation=activation, bias=bias,
               num_kv_heads=2)
    model = Encoder(cfg).eval()
    ids = torch.randint(1, 97, (2, 11))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    fused = model(input_ids=ids, attention_mask=mask).last_hidden_state
    out = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    assert fused.shape == (2, 11, 32) and torch.isfinite(fused).all()
    assert (fused - out.last_hidden_state)[mask.bool()].abs().max() <= 1e-5
    assert not bias or any(n.endswith("bias") for n, _ in model.named_parameters())
    if not bias:
        assert not any(n.endswith(".bias") for n, _ in model.named_parameters() if "pooler" not in n)


def test_post_ln_and_pre_ln_are_the_formulas():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 32)
    for placement in ("post", "pre"):
        block = Block(tiny(norm_placement=placement)).eval()
        got, _ = block(x)
        a = block.attn(block.attn_norm(x) if placement == "pre" else x)[0]
        if placement == "post":
            h = block.attn_norm(x + a)
            expect = block.ffn_norm(h + block.ffn(h))
        else:
            h = x + a
            expect = h + block.ffn(block.ffn_norm(h))
        assert torch.allclose(got, expect, atol=1e-6)


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "geglu", "swiglu"])
def test_feedforward_activations(activation):
    torch.manual_seed(0)
    ffn = FeedForward(tiny(activation=activation))
    x = torch.randn(3, 32)
    up = ffn.up(x)
    if activation == "geglu":
        expect = ffn.down(F.gelu(ffn.gate(x)) * up)
    elif activation == "swiglu":
        expect = ffn.down(F.silu(ffn.gate(x)) * up)
    else:
        act = {"relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}[activation]
        expect = ffn.down(act(up))
        assert ffn.gate is None
    assert torch.allclose(ffn(x), expect, atol=1e-6)


def test_causal_stack_never_looks_ahead():
    torch.manual_seed(0)
    model = Encoder(tiny(causal=True, norm_placement="pre", pooler=False)).eval()
    ids = torch.randint(1, 97, (1, 12))
    a = model(input_ids=ids).last_hidden_state
    changed = ids.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % 97
    b = model(input_ids=changed).last_hidden_state
    assert torch.allclose(a[:, :8], b[:, :8], atol=1e-6)
    assert not torch.allclose(a[:, 8:], b[:, 8:], atol=1e-3)


def test_sliding_window_cannot_see_beyond_window():
    torch.manual_seed(0)
    model = Encoder(tiny(sliding_window=3, num_layers=1, position="rope")).eval()
    ids = torch.randint(1, 97, (1, 16))
    a = model(input_ids=ids).last_hidden_state
    changed = ids.clone()
    changed[0, 15] = (changed[0, 15] + 1) % 97
    b = model(input_ids=changed).last_hidden_state
    # one local layer: position p sees p-2..p+2, so only 13, 14, 15 may change
    diff = (a - b).abs().amax(-1)[0]
    assert (diff[:13] < 1e-6).all() and (diff[13:] > 1e-6).all()


def test_padding_does_not_change_real_tokens():
    torch.manual_seed(0)
    model = Encoder(tiny()).eval()
    ids = torch.randint(1, 97, (1, 7))
    alone = model(input_ids=ids).last_hidden_state
    padded = torch.cat([ids, torch.zeros(1, 5, dtype=torch.long)], 1)
    mask = torch.cat([torch.ones(1, 7), torch.zeros(1, 5)], 1).long()
    both = model(input_ids=padded, attention_mask=mask).last_hidden_state
    assert torch.allclose(alone, both[:, :7], atol=1e-6)


def test_factorized_embeddings_shrink_parameters():
    full = Encoder(tiny(vocab_size=5000, hidden_size=64, num_heads=4)).num_parameters()
    factorized = Encoder(tiny(vocab_size=5000, hidden_size=64, num_heads=4, embedding_size=16)).num_parameters()
    assert factorized < full - 5000 * 40
    out = Encoder(tiny(embedding_size=16))(input_ids=torch.tensor([[1, 2, 3]])).last_hidden_state
    assert out.shape == (1, 3, 32)


def test_dropout_only_in_training():
    cfg = tiny(dropout=0.5, attention_dropout=0.5)
    model = Encoder(cfg)
    ids = torch.randint(1, 97, (2, 9))
    model.train()
    assert not torch.allclose(model(input_ids=ids).last_hidden_state, model(input_ids=ids).last_hidden_state)
    model.eval()
    assert torch.equal(model(input_ids=ids).last_hidden_state, model(input_ids=ids).last_hidden_state)


@pytest.mark.parametrize("kw", [dict(), dict(position="rope", norm_placement="pre", activation="swiglu", num_kv_heads=2),
                                dict(position="relative_bias", norm="rmsnorm"), dict(sliding_window=3),
                                dict(causal=True, norm_placement="pre")])
def test_unpadded_equals_padded(kw):
    """Unpadding is a representation: same numbers at every real position, zeros at padding."""
    torch.manual_seed(0)
    model = Encoder(tiny(**kw)).eval()
    ids = torch.randint(1, 97, (3, 12))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    mask[2, 2:] = 0
    types = (torch.arange(12) >= 5).long().expand(3, 12)
    padded = model(input_ids=ids, attention_mask=mask, token_type_ids=types, unpad=False, output_hidden_states=True)
    unpadded = model(input_ids=ids, attention_mask=mask, token_type_ids=types, unpad=True, output_hidden_states=True)
    real = mask.bool()
    assert (padded.last_hidden_state - unpadded.last_hidden_state)[real].abs().max() <= 1e-5
    assert (unpadded.last_hidden_state[~real] == 0).all()
    for a, b in zip(padded.hidden_states, unpadded.hidden_states):
        assert (a - b)[real].abs().max() <= 1e-5


def test_default_unpads_only_batches_with_enough_padding():
    """unpad=None: a batch whose padding share reaches unpad_min_padding runs unpadded (zeros at padding),
    one with less runs padded (the scatter per layer would cost more than the padding it saves)."""
    torch.manual_seed(0)
    model = Encoder(tiny()).eval()
    ids = torch.randint(1, 97, (4, 10))
    little, much = torch.ones_like(ids), torch.ones_like(ids)
    little[0, 9:] = 0      # 1 of 40 positions: 2.5% padding
    much[0, 5:] = 0        # 5 of 40: 12.5%
    for mask, unpadded in ((little, False), (much, True)):
        out = model(input_ids=ids, attention_mask=mask).last_hidden_state
        assert bool((out[~mask.bool()] == 0).all()) == unpadded
        forced = model(input_ids=ids, attention_mask=mask, unpad=not unpadded).last_hidden_state
        assert (out - forced)[mask.bool()].abs().max() <= 1e-5


def test_unpadded_attention_weights_match():
    torch.manual_seed(0)
    model = Encoder(tiny()).eval()
    ids = torch.randint(1, 97, (2, 9))
    mask = torch.tensor([[1] * 9, [1] * 4 + [0] * 5])
    a = model(input_ids=ids, attention_mask=mask, unpad=False, output_attentions=True).attentions
    b = model(input_ids=ids, attention_mask=mask, unpad=True, output_attentions=True).attentions
    for wa, wb in zip(a, b):
        assert (wa - wb)[0].abs().max() <= 1e-6 and (wa - wb)[1, :, :4].abs().max() <= 1e-6


@pytest.mark.parametrize("kw", [dict(causal=True, norm_placement="pre"),
                                dict(causal=True, position="rope", norm_placement="pre", num_kv_heads=2)])
def test_unpadded_prefill_into_a_kv_cache_equals_padded(kw):
    """A left-padded batch of prompts filling a KV cache runs unpadded too; the next step reads the same cache."""
    from attnlab.inference.kv_cache import KVCache
    torch.manual_seed(0)
    model = Encoder(tiny(**kw)).eval()
    ids = torch.randint(1, 97, (3, 8))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    mask[2, :6] = 0
    outs = []
    for unpad in (False, True):
        cache = KVCache(model.config.num_layers)
        first = model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True, unpad=unpad)
        step_mask = torch.cat([mask, torch.ones(3, 1, dtype=mask.dtype)], 1)
        nxt = model(input_ids=ids[:, -1:], attention_mask=step_mask, past_key_values=cache, use_cache=True, unpad=unpad)
        outs.append((first.last_hidden_state, nxt.last_hidden_state))
    real = mask.bool()
    assert (outs[0][0] - outs[1][0])[real].abs().max() <= 1e-5
    assert (outs[1][0][~real] == 0).all()  # the unpadded path really ran
    assert (outs[0][1] - outs[1][1]).abs().max() <= 1e-5


def test_bf16_training_on_a_cpu_runs_padded():
    """Under CPU bf16 autocast with gradients the default keeps the padded layout (an unpadded batch gives each
    product a new row count, and oneDNN keeps resources per shape); inference and fp32 training unpad."""
    torch.manual_seed(0)
    model = Encoder(tiny()).train()
    ids = torch.randint(1, 97, (4, 10))
    mask = torch.ones_like(ids)
    mask[0, 5:] = 0        # 12.5% padding: unpadded by default
    unpadded = lambda out: bool((out[~mask.bool()] == 0).all())  # noqa: E731
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not unpadded(model(input_ids=ids, attention_mask=mask).last_hidden_state)
        with torch.no_grad():
            assert unpadded(model(input_ids=ids, attention_mask=mask).last_hidden_state)
    assert unpadded(model(input_ids=ids, attention_mask=mask).last_hidden_state)


def test_varlen_rounds_rows_with_padding_positions_that_pad_drops():
    from attnlab.nn.varlen import Varlen, rounded_rows
    assert [rounded_rows(n, 16) for n in (1, 15, 17, 1000, 1024, 1025, 5000)] == [1, 15, 17, 1024, 1024, 1088, 5120]
    assert rounded_rows(1000, 0) == 1000 and rounded_rows(5, 1) == 8
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0]])  # 6 real of 12
    v = Varlen.from_mask(mask, sizes_per_octave=2)                    # 6 is a size (a multiple of 2): kept
    assert v.num_tokens == 6 == v.real
    v = Varlen.from_mask(mask, sizes_per_octave=1)                    # 6 -> 8
    assert v.num_tokens == 8 and v.real == 6
    assert v.indices[:6].tolist() == [0, 1, 2, 4, 8, 9]
    assert not mask.flatten()[v.indices[6:]].any()  # the two added rows are padding positions
    x = torch.arange(8.0).unsqueeze(-1)
    assert v.pad(x).flatten().tolist() == [0, 1, 2, 0, 3, 0, 0, 0, 4, 5, 0, 0]
    assert Varlen.from_mask(mask[:2], sizes_per_octave=1).num_tokens == 4  # 4 real: a size already
    five = torch.tensor([[1, 1, 1, 1, 1, 0]])
    assert Varlen.from_mask(five, sizes_per_octave=1).num_tokens == 6  # 5 -> 8, but never past the batch
    assert Varlen.from_mask(mask).num_tokens == 6


@pytest.mark.parametrize("sizes", [0, 2])
def test_training_with_rounded_unpadded_rows_equals_padded(sizes, monkeypatch):
    """Training rounds the unpadded row count up (Encoder.unpad_sizes_per_octave): the loss and every gradient
    equal the padded layout's; the layers see the rounded count in training and the exact count under no_grad."""
    torch.manual_seed(0)
    model = Encoder(tiny()).train()
    monkeypatch.setattr(model, "unpad_sizes_per_octave", sizes)
    ids = torch.randint(1, 97, (4, 10))
    mask = torch.ones_like(ids)
    mask[0, 5:], mask[2, 3:] = 0, 0          # 28 real tokens: 32 with two sizes per octave (16, 24, 32, 48...)
    rows = []
    count = lambda m, a: rows.append(a[0].reshape(-1, a[0].size(-1)).size(0))  # noqa: E731
    hook = model.layers[0].ffn.register_forward_pre_hook(count)
    grads = []
    for unpad in (False, True):
        model.zero_grad()
        out = model(input_ids=ids, attention_mask=mask, unpad=unpad).last_hidden_state
        (out[mask.bool()] ** 2).mean().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert rows[1] == (28 if sizes == 0 else 32)
    assert grads[0].keys() == grads[1].keys()
    for name, g in grads[0].items():
        assert (g - grads[1][name]).abs().max() <= 1e-5, name
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, unpad=True)
    hook.remove()
    assert rows[2] == 28
