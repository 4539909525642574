"""The one-pass CPU kernels of nn/fused.py (RMSNorm, SiLU gate, bf16 RoPE) against the torch ops they replace,
on their own and inside a model; and the cases where they must stand aside."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import attnlab
from attnlab.config import preset
from attnlab.nn import fused
from attnlab.nn.positions import RotaryEmbedding, rotate_half

pytestmark = pytest.mark.skipif(fused.kernels.library() is None, reason="no C compiler: the kernels cannot be built")
BF16_ULP = 2 ** -7  # relative spacing of bf16 values


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


def _close(out, ref, dtype):
    """fp32: rounding only; bf16: at most one bf16 ulp, and rarely (the sum order and e^x may move the last bit)."""
    if dtype == torch.float32:
        torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
        return
    diff = (out.float() - ref.float()).abs()
    assert (diff <= ref.float().abs() * BF16_ULP + 1e-30).all()
    assert (out != ref).float().mean() < 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("threads", [1, 2])
def test_rms_norm_and_silu_gate_equal_torch(dtype, threads):
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(0)
        x = (torch.randn(300, 576, generator=gen) * 3).to(dtype)
        w = torch.nn.Parameter(torch.randn(576, generator=gen).to(dtype))
        _close(fused.rms_norm(x, w, 1e-5), F.rms_norm(x, (576,), w, 1e-5), dtype)
        g = (torch.randn(300, 1536, generator=gen) * 4).to(dtype)
        g[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -0.0])  # the ends of e^x's clamp and zero
        u = torch.randn(300, 1536, generator=gen).to(dtype)
        _close(fused.silu_mul(g, u), F.silu(g) * u, dtype)
    finally:
        torch.set_num_threads(old)


def test_fp32_silu_gate_agrees_with_the_portable_loop(tmp_path):
    """Where the CPU has AVX2 + FMA, fp32 rows take 8-lane intrinsics (gcc leaves the portable loop scalar).
    Built here without -march (so without FMA: the last bit may move), the portable loop agrees to 2 ulp,
    tail elements and e^x's clamp included."""
    import ctypes
    import subprocess
    from attnlab.nn import kernel_build, kernels
    cc = kernels.find_compiler()[0]
    so = tmp_path / "portable.so"
    subprocess.run([cc, "-O3", "-shared", "-fPIC", "-o", str(so), str(kernel_build._CSRC / "fused_rows.c"), "-lm"],
                   check=True)
    portable = ctypes.CDLL(str(so)).silu_mul_rows
    gen = torch.Generator().manual_seed(3)
    g = torch.randn(20_001, generator=gen) * 6  # (enough elements for fused.silu_mul to call C)
    g[:6] = torch.tensor([-100.0, 100.0, 0.0, -0.0, -87.5, 88.5])
    u = torch.randn(20_001, generator=gen)
    want = torch.empty_like(g)
    ptr = ctypes.c_void_p
    assert portable(ptr(g.data_ptr()), ptr(u.data_ptr()), ptr(want.data_ptr()), 0, ctypes.c_int64(0),
                    ctypes.c_int64(g.numel())) == 0
    fused_out = fused.silu_mul(g, u)
    assert fused_out is not None
    torch.testing.assert_close(fused_out, want, rtol=2.5e-7, atol=1e-37)
    assert torch.equal(fused_out[2:4], want[2:4]) and (want != 0).sum() > 19_990


@pytest.mark.parametrize("batch_cos", [1, 3])
def test_bf16_rope_equals_torch_bit_for_bit_on_a_strided_slice(batch_cos):
    b, h, t, d = 3, 4, 50, 64
    stacked = torch.randn(b, t, 3 * h, d).bfloat16()  # Q, K, V side by side, as one stacked product gives them
    q = stacked[:, :, :h].transpose(1, 2)
    cos, sin = RotaryEmbedding(d)(torch.arange(t)[None].expand(batch_cos, t) + torch.arange(batch_cos)[:, None])
    out = fused.rope(q, cos, sin)
    ref = q * cos.to(q.dtype) + rotate_half(q) * sin.to(q.dtype)
    assert out is not None and torch.equal(out, ref)


def test_the_kernels_stand_aside_where_they_must(monkeypatch):
    x = torch.randn(64, 576)
    w = torch.ones(576)
    cos, sin = RotaryEmbedding(64)(torch.arange(64)[None])
    q = torch.randn(1, 8, 64, 64).bfloat16()
    assert fused.rms_norm(x, w, 1e-5) is not None
    assert fused.rms_norm(x[:, :300], w[:300], 1e-5) is None            # not contiguous
    assert fused.rms_norm(x[:2], w, 1e-5) is None                       # too small to pay for the call
    assert fused.rope(q.float(), cos, sin) is None                      # fp32 RoPE: torch's ops
    assert fused.rope(q, cos[..., :32], sin[..., :32]) is None          # partial rotary
    with torch.enable_grad():
        assert fused.rms_norm(x, w, 1e-5) is None                       # training: autograd needs torch's ops
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert fused.rms_norm(x, w, 1e-5) is None
    monkeypatch.setenv("ATTNLAB_FUSED", "0")                             # the user's switch
    assert fused.rms_norm(x, w, 1e-5) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_llama_forward_is_the_same_with_and_without_the_kernels(dtype, monkeypatch):
    cfg = preset("mistral-7b", vocab_size=300, hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                 intermediate_size=256, dropout=0.0, attention_dropout=0.0)
    assert (cfg.norm, cfg.activation, cfg.position) == ("rmsnorm", "swiglu", "rope")
    model = attnlab.from_config(cfg).to(dtype).eval()
    ids = torch.randint(0, 300, (2, 200), generator=torch.Generator().manual_seed(1))
    calls = {"n": 0}
    real = fused.kernels.active

    def counted(name):
        calls["n"] += name == "fused_rows"
        return real(name)
    monkeypatch.setattr(fused.kernels, "active", counted)
    with_kernels = model(input_ids=ids).logits
    # every norm (2 a layer and the final one) and gate went through them, and in bf16 RoPE (Q and K) too
    assert calls["n"] == 3 * cfg.num_layers + 1 + (2 * cfg.num_layers if dtype == torch.bfloat16 else 0)
    monkeypatch.setattr(fused.kernels, "active", lambda name: False)
    without = model(input_ids=ids).logits
    tol = 1e-5 if dtype == torch.float32 else 0.05
    torch.testing.assert_close(with_kernels.float(), without.float(), rtol=tol, atol=tol)


def test_a_jit_trace_sees_torch_ops_not_the_c_call():
    from attnlab.nn.norms import RMSNorm
    norm = RMSNorm(576).eval()
    x = torch.randn(64, 576)
    traced = torch.jit.trace(norm, (x,))
    y = torch.randn(64, 576) * 5  # other values: a trace that baked the C call's output would repeat the old one
    torch.testing.assert_close(traced(y), F.rms_norm(y, (576,), norm.weight, norm.eps))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("threads", [1, 2])
def test_lse_tiles_give_torchs_log_softmax_nll(dtype, threads):
    """Tiles of uneven width (the last 237 columns), folded in one after another: the same NLL per row as
    F.cross_entropy over the whole row in fp32, and targets picked from the right tile."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(1)
        n, vocab, tile = 70, 1437, 300
        logits = (torch.randn(n, vocab, generator=gen) * 6).to(dtype)
        logits[0, 5] = 60.0  # a row whose max sits far above the rest, in the first tile
        targets = torch.randint(0, vocab, (n,), generator=gen)
        targets[:3] = torch.tensor([0, vocab - 1, 5])
        run_max, run_sum, picked = torch.full((n,), float("-inf")), torch.zeros(n), torch.zeros(n)
        for v0 in range(0, vocab, tile):
            assert fused.lse_tile(logits[:, v0:v0 + tile].contiguous(), targets, v0, run_max, run_sum, picked)
        ours = run_max + run_sum.log() - picked
        ref = F.cross_entropy(logits.float(), targets, reduction="none")
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    finally:
        torch.set_num_threads(old)


def test_lse_tile_stands_aside_for_what_it_cannot_read():
    logits, t = torch.randn(100, 300), torch.zeros(100, dtype=torch.int64)
    state = [torch.zeros(100) for _ in range(3)]
    assert not fused.lse_tile(logits.t().contiguous().t(), t, 0, *state)  # not contiguous
    assert not fused.lse_tile(logits, t.int(), 0, *state)                # int32 targets
    assert not fused.lse_tile(logits, t[:50], 0, *state)                 # one target per row
    assert not fused.lse_tile(logits.half(), t, 0, *state)               # fp16
