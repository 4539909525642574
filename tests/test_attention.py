"""The fused (SDPA) and explicit paths must mean the same thing for every mask kind, and both must
equal a naive loop over heads written straight from the formula."""
import math

import pytest
import torch
import torch.nn.functional as F

from attnlab.config import ModelConfig
from attnlab.nn import Attention, AttentionMask, scaled_dot_product_attention
from attnlab.nn.positions import RelativePositionBias


def naive_attention(q, k, v, allowed, bias=None, scale=None):
    """softmax(q k^T / sqrt(d) + bias) v, one batch row and head at a time, masking with -inf."""
    b, h, tq, d = q.shape
    groups = h // k.shape[1]
    scale = 1 / math.sqrt(d) if scale is None else scale
    out = torch.zeros_like(q)
    for bi in range(b):
        for hi in range(h):
            kh, vh = k[bi, hi // groups], v[bi, hi // groups]
            s = q[bi, hi] @ kh.T * scale
            if bias is not None:
                s = s + bias[0, hi]
            s = s.masked_fill(~allowed[bi, 0], float("-inf"))
            out[bi, hi] = torch.softmax(s, -1) @ vh
    return out


def make_qkv(b=3, h=4, hkv=4, t=9, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, t, d, generator=g), torch.randn(b, hkv, t, d, generator=g),
            torch.randn(b, hkv, t, d, generator=g))


def padding(b=3, t=9, left=False):
    lengths = [t, t - 3, 2][:b]
    m = torch.zeros(b, t, dtype=torch.long)
    for i, n in enumerate(lengths):
        if left:
            m[i, t - n:] = 1
        else:
            m[i, :n] = 1
    return m


CASES = {
    "none": dict(),
    "padding": dict(padding=padding()),
    "causal": dict(causal=True),
    "causal+left-padding": dict(causal=True, padding=padding(left=True)),
    "window": dict(window=3),
    "causal+window+padding": dict(causal=True, window=3, padding=padding()),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("hkv", [4, 2, 1])  # MHA, GQA, MQA
def test_fused_equals_explicit_equals_naive(case, hkv):
    q, k, v = make_qkv(hkv=hkv)
    kw = CASES[case]
    mask = AttentionMask.build(kw.get("padding"), 9, 9, causal=kw.get("causal", False), window=kw.get("window"))
    fused, none = scaled_dot_product_attention(q, k, v, mask)
    explicit, weights = scaled_dot_product_attention(q, k, v, mask, explicit=True)
    assert none is None and weights.shape == (3, 4, 9, 9)
    allowed = mask.allowed if mask.allowed is not None else torch.ones(1, 1, 9, 9, dtype=torch.bool)
    if mask.is_causal:
        allowed = torch.ones(9, 9, dtype=torch.bool).tril()[None, None]
    reference = naive_attention(q, k, v, allowed.expand(3, 1, 9, 9))
    assert (fused - explicit).abs().max() <= 1e-6
    assert (explicit - reference).abs().max() <= 1e-5
    assert torch.allclose(weights.sum(-1), torch.ones(3, 4, 9))
    assert (weights[~allowed.expand(3, 4, 9, 9)] == 0).all()  # masked keys get exactly zero weight


def test_relative_bias_paths_agree():
    q, k, v = make_qkv()
    bias = RelativePositionBias(4, 32, 128)(9, 9)
    for causal in (False, True):
        mask = AttentionMask.build(padding(), 9, 9, causal=causal)
        fused, _ = scaled_dot_product_attention(q, k, v, mask, bias, scale=1.0)
        explicit, _ = scaled_dot_product_attention(q, k, v, mask, bias, scale=1.0, explicit=True)
        reference = naive_attention(q, k, v, mask.allowed.expand(3, 1, 9, 9), bias, scale=1.0)
        assert (fused - explicit).abs().max() <= 1e-6
        assert (explicit - reference).abs().max() <= 1e-5


def test_causal_shortcut_with_bias():
    q, k, v = make_qkv()
    bias = RelativePositionBias(4, 32, 128, bidirectional=False)(9, 9)
    mask = AttentionMask.build(None, 9, 9, causal=True)
    assert mask.is_causal and mask.allowed is None
    fused, _ = scaled_dot_product_attention(q, k, v, mask, bias)
    explicit, w = scaled_dot_product_attention(q, k, v, mask, bias, explicit=True)
    assert (fused - explicit).abs().max() <= 1e-6
    assert (w.triu(1) == 0).all()


def test_window_mask_shape_and_query_offset():
    # decoding step 7 of a causal local model with window 3 sees keys 5, 6, 7 only
    mask = AttentionMask.build(None, 1, 8, causal=True, window=3, query_offset=7)
    assert mask.allowed[0, 0, 0].nonzero().flatten().tolist() == [5, 6, 7]


def test_fully_masked_rows_do_not_make_nan():
    q, k, v = make_qkv()
    mask = AttentionMask.build(padding(left=True), 9, 9, causal=True)
    out, w = scaled_dot_product_attention(q, k, v, mask, explicit=True)
    fused, _ = scaled_dot_product_attention(q, k, v, mask)
    assert torch.isfinite(out).all() and torch.isfinite(fused).all()


def test_module_returns_weights_only_on_request_and_agrees():
    cfg = ModelConfig(hidden_size=32, num_heads=4, num_kv_heads=2, num_layers=1, intermediate_size=64,
                      vocab_size=50, attention_dropout=0.0)
    attn = Attention(cfg).eval()
    x = torch.randn(2, 6, 32)
    mask = AttentionMask.build(torch.tensor([[1] * 6, [1] * 4 + [0] * 2]), 6, 6)
    fused, none = attn(x, mask)
    explicit, w = attn(x, mask, need_weights=True)
    assert none is None and w.shape == (2, 4, 6, 6)
    assert (fused - explicit).abs().max() <= 1e-6


@pytest.mark.parametrize("bias", [True, False])
def test_stacked_qkv_without_grad_equals_three_projections_and_follows_weight_updates(bias):
    cfg = ModelConfig(hidden_size=32, num_heads=4, num_kv_heads=2, num_layers=1, intermediate_size=64,
                      vocab_size=50, attention_dropout=0.0, bias=bias)
    attn = Attention(cfg).eval()
    x = torch.randn(2, 6, 32)
    mask = AttentionMask.build(torch.tensor([[1] * 6, [1] * 4 + [0] * 2]), 6, 6)
    separate, _ = attn(x, mask)  # grad enabled: three products
    with torch.no_grad():
        stacked, _ = attn(x, mask)
        assert "_qkv_cache" in attn.__dict__  # the stacked path really ran
        assert (stacked - separate).abs().max() <= 1e-6
        attn.k.weight.mul_(2)  # an in-place update (an optimizer step, load_state_dict) must be seen
        if bias:
            attn.v.bias.add_(1)
        changed, _ = attn(x, mask)
    expected, _ = attn(x, mask)
    assert (changed - stacked).abs().max() > 1e-3
    assert (changed - expected).abs().max() <= 1e-6
    assert "_qkv_cache" not in attn.state_dict() and len(attn.state_dict()) == (8 if bias else 4)


@pytest.mark.parametrize("hkv", [4, 2])
def test_long_causal_inference_in_query_blocks_equals_one_call(hkv, monkeypatch):
    """Without grad, a long causal self-attention runs as query blocks that skip the keys after them:
    same output as one fused causal call (and as the explicit path), on a length that leaves a short block."""
    import attnlab.nn.attention as A
    calls = []
    real = A._causal_blocks
    monkeypatch.setattr(A, "_causal_blocks", lambda *a: calls.append(1) or real(*a))
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 300, 16), torch.randn(2, hkv, 300, 16), torch.randn(2, hkv, 300, 16)
    causal = AttentionMask(None, is_causal=True)
    with torch.no_grad():
        got, _ = scaled_dot_product_attention(q, k, v, causal)
        rep = 4 // hkv
        want = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                              is_causal=True)
        explicit, _ = scaled_dot_product_attention(q, k, v, causal, explicit=True)
    assert calls == [1]
    assert (got - want).abs().max().item() <= 1e-5 and (got - explicit).abs().max().item() <= 1e-5
    q.requires_grad_(True)  # training keeps the single fused call
    scaled_dot_product_attention(q, k, v, causal)
    assert calls == [1]


@pytest.mark.parametrize("autocast", [False, True])
def test_bf16_training_attention_runs_in_fp32_on_short_sequences(autocast):
    """Under grad, bf16 q/k/v on a CPU with at most 256 keys: attention is the fp32 computation rounded once to
    bf16 (torch's bf16 flash kernel is ~3x slower backwards there), gradients included; longer: the bf16 kernel."""
    import contextlib
    gen = torch.Generator().manual_seed(0)
    base = [torch.randn(2, 4, 64, 16, generator=gen) for _ in range(3)]
    q, k, v = (t.bfloat16().requires_grad_() for t in base)
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with ctx:
        out, _ = scaled_dot_product_attention(q, k, v, AttentionMask(None, is_causal=True))
    assert out.dtype == torch.bfloat16
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    want = F.scaled_dot_product_attention(q32, k32, v32, is_causal=True)
    assert torch.equal(out, want.bfloat16())
    grad = torch.randn(2, 4, 64, 16, generator=gen).bfloat16()
    out.backward(grad)
    want.backward(grad.float())
    for ours, ref in ((q, q32), (k, k32), (v, v32)):
        assert torch.equal(ours.grad, ref.grad.bfloat16())
    long = [t.bfloat16().repeat(1, 1, 5, 1).requires_grad_() for t in base]  # 320 keys
    out, _ = scaled_dot_product_attention(*long, AttentionMask(None, is_causal=True))
    assert torch.equal(out, F.scaled_dot_product_attention(*long, is_causal=True))
