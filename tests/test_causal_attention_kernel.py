"""The bf16 causal self-attention kernel of nn/cpu_attention.py (csrc/causal_attention.c) against the fp32
answer, side by side with torch's bf16 kernel: no worse than torch's; where it runs and where it stands aside."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import attnlab
import attnlab.nn.attention as A
from attnlab.config import preset
from attnlab.nn import AttentionMask, scaled_dot_product_attention
from attnlab.nn.cpu_attention import causal_attention
from attnlab.nn.kernels import kernel_reason

HAS_KERNEL = kernel_reason("causal_attention") == ""
needs_kernel = pytest.mark.skipif(not HAS_KERNEL, reason="needs a C compiler and a CPU with AVX512-BF16")


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


def _qkv(b, h, hk, t, d, seed=0, model_layout=True):
    """bf16 q (B, H, T, D), k / v (B, Hk, T, D); model_layout: views of (B, T, heads, D) buffers, as a
    model's projections give them."""
    gen = torch.Generator().manual_seed(seed)
    if model_layout:
        return [torch.randn(b, t, n, d, generator=gen).bfloat16().transpose(1, 2) for n in (h, hk, hk)]
    return [torch.randn(b, n, t, d, generator=gen).bfloat16() for n in (h, hk, hk)]


@needs_kernel
@pytest.mark.parametrize("shape", [(4, 9, 3, 512, 64), (2, 4, 4, 200, 128), (1, 6, 2, 129, 64),
                                   (3, 8, 1, 300, 64), (1, 2, 1, 131, 64)])
@pytest.mark.parametrize("threads", [1, 2])
def test_equal_to_the_fp32_answer_as_closely_as_torchs_bf16_kernel(shape, threads):
    b, h, hk, t, d = shape
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        q, k, v = _qkv(b, h, hk, t, d, model_layout=shape[0] != 2)
        scale = d ** -0.5
        want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True, scale=scale,
                                              enable_gqa=True)
        torch_bf16 = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
        ours = causal_attention(q, k, v, scale)
    finally:
        torch.set_num_threads(old)
    assert ours is not None and ours.shape == want.shape and ours.dtype == torch.bfloat16
    err, ref_err = (ours.float() - want).abs(), (torch_bf16.float() - want).abs()
    assert err.max() <= 1.5 * ref_err.max() + 1e-3
    assert err.mean() <= 1.1 * ref_err.mean() + 1e-5
    # the first position sees only itself: its value row, to bf16 rounding
    torch.testing.assert_close(ours[:, :, 0].float(), v.repeat_interleave(h // hk, 1)[:, :, 0].float())


@needs_kernel
def test_scaled_dot_product_attention_uses_it_for_long_bf16_inference(monkeypatch):
    calls = []
    monkeypatch.setattr(A, "causal_attention", lambda *a: calls.append(1) or causal_attention(*a))
    q, k, v = _qkv(2, 6, 2, 300, 64)
    causal = AttentionMask(None, is_causal=True)
    got, _ = scaled_dot_product_attention(q, k, v, causal)
    assert calls == [1]
    assert torch.equal(got, causal_attention(q, k, v, 64 ** -0.5))
    scaled_dot_product_attention(q[:, :, :100], k[:, :, :100], v[:, :, :100], causal)  # short: torch's call
    assert calls == [1]


@needs_kernel
def test_it_stands_aside_where_it_must(monkeypatch):
    q, k, v = _qkv(1, 4, 2, 160, 64)
    assert causal_attention(q, k, v, 0.125) is not None
    assert causal_attention(q.float(), k.float(), v.float(), 0.125) is None    # fp32: torch's kernel
    assert causal_attention(q[..., :32], k[..., :32], v[..., :32], 0.125) is None  # head size 32
    assert causal_attention(q, k[:, :, :100], v[:, :, :100], 0.125) is None   # not self-attention
    assert causal_attention(q[:, :3], k, v, 0.125) is None                     # 3 heads over 2 key heads
    with torch.enable_grad():
        assert causal_attention(q, k, v, 0.125) is None                        # training
    monkeypatch.setenv("ATTNLAB_FUSED", "0")                                    # the user's switch
    assert causal_attention(q, k, v, 0.125) is None


@needs_kernel
def test_a_bf16_llama_forward_is_the_same_with_and_without_it(monkeypatch):
    cfg = preset("mistral-7b", vocab_size=300, hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=2,
                 intermediate_size=256, dropout=0.0, attention_dropout=0.0, sliding_window=None)  # LLaMA's mask
    assert cfg.hidden_size // cfg.num_heads == 64
    model = attnlab.from_config(cfg).to(torch.bfloat16).eval()
    ids = torch.randint(0, 300, (2, 200), generator=torch.Generator().manual_seed(1))
    calls = []
    monkeypatch.setattr(A, "causal_attention", lambda *a: calls.append(1) or causal_attention(*a))
    with_kernel = model(input_ids=ids).logits.float()
    assert len(calls) == cfg.num_layers
    monkeypatch.setattr(A, "causal_attention", lambda *a: None)
    without = model(input_ids=ids).logits.float()
    assert (with_kernel - without).abs().mean() < 0.02 * without.abs().mean()


def test_on_any_cpu_it_runs_only_where_the_kernel_is_and_attention_stays_torchs_elsewhere():
    # an AVX2-only CPU (no bf16 dot products) must take torch's kernel with no error and the same answer
    q, k, v = _qkv(1, 4, 2, 300, 64)
    assert (causal_attention(q, k, v, 0.125) is not None) == HAS_KERNEL
    causal = AttentionMask(None, is_causal=True)
    got, _ = scaled_dot_product_attention(q, k, v, causal)
    want = F.scaled_dot_product_attention(q.float(), k.float().repeat_interleave(2, 1),
                                          v.float().repeat_interleave(2, 1), is_causal=True)
    assert (got.float() - want).abs().max() < 0.05
