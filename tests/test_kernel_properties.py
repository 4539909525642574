"""Every Python entry point over a C kernel, driven with random shapes, dtypes, strides, masks and devices
('meta' stands in for a device that is not the CPU), against torch's reference: the same numbers (the
kernels' test tolerances) or a refusal that says why (ValueError) - never a wrong result."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnlab.nn import AttentionMask, fused, kernels, scaled_dot_product_attention
from attnlab.nn import quantized as q
from attnlab.nn.cpu_attention import causal_attention, short_attention
from attnlab.nn.int8 import Int8Linear

FAST = settings(max_examples=25, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
DTYPES = st.sampled_from([torch.float32, torch.bfloat16, torch.float16])
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


def _torch_only(fn):
    """fn() with every C kernel switched off: the PyTorch path."""
    real = kernels.active
    kernels.active = lambda name: False
    try:
        return fn()
    finally:
        kernels.active = real


def _close(got: torch.Tensor, want: torch.Tensor, dtype=None) -> None:
    tol = TOL[dtype or got.dtype] if (dtype or got.dtype) in TOL else 1e-5
    assert got.shape == want.shape and got.dtype == want.dtype
    if not want.numel():
        return
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol * max(1.0, want.float().abs().max().item()))


def _layout(x: torch.Tensor, transposed: bool) -> torch.Tensor:
    """The same values, as a non-contiguous view when asked."""
    return x.t().contiguous().t() if transposed and x.dim() == 2 else x


@FAST
@given(in_f=st.integers(1, 70), out_f=st.integers(1, 50), rows=st.integers(0, 20), buf=DTYPES, xdt=DTYPES,
       smooth=st.booleans(), bias=st.booleans(), transposed=st.booleans(), codes=st.sampled_from(["s8", "u7"]),
       seed=st.integers(0, 99))
def test_int8_linear(in_f, out_f, rows, buf, xdt, smooth, bias, transposed, codes, seed):
    g = torch.Generator().manual_seed(seed)
    lin = torch.nn.Linear(in_f, out_f, bias=bias)
    layer = Int8Linear.from_linear(lin, torch.rand(in_f, generator=g) + 0.5 if smooth else None, codes).to(buf)
    x = _layout(torch.randn(rows, in_f, generator=g), transposed).to(xdt)
    got = layer(x)
    _close(got, _torch_only(lambda: layer(x)), xdt)
    meta = layer.to("meta")
    try:
        out = meta(x.to("meta"))
    except (ValueError, NotImplementedError, RuntimeError) as err:  # torch's meta kernels may lack _int_mm
        assert "meta" in str(err).lower() or "not implemented" in str(err).lower()
    else:
        assert out.device.type == "meta" and out.shape == (rows, out_f)


def _reference_attention(q_, k, v, keep, scale):
    mask = None
    if keep is not None:
        keep = keep.to(torch.bool).expand(q_.size(0), k.size(2))
        keep = keep | ~keep.any(-1, keepdim=True)
        mask = keep[:, None, None, :]
    if k.size(1) != q_.size(1):
        k = k.repeat_interleave(q_.size(1) // k.size(1), 1)
        v = v.repeat_interleave(q_.size(1) // v.size(1), 1)
    return F.scaled_dot_product_attention(q_, k, v, attn_mask=mask, scale=scale)


@FAST
@given(b=st.integers(1, 3), hk=st.integers(1, 2), group=st.integers(1, 2), tq=st.integers(1, 20),
       tk=st.integers(1, 40), d=st.sampled_from([8, 16, 32, 48]), dtype=DTYPES, model_layout=st.booleans(),
       kv_batch_one=st.booleans(), mask=st.sampled_from(["none", "B,S", "1,S", "B,S float"]), seed=st.integers(0, 99))
def test_short_attention(b, hk, group, tq, tk, d, dtype, model_layout, kv_batch_one, mask, seed):
    g = torch.Generator().manual_seed(seed)
    hq = hk * group
    q_ = torch.randn(b, tq, hq, d, generator=g).transpose(1, 2) if model_layout else torch.randn(b, hq, tq, d, generator=g)
    kb = 1 if kv_batch_one else b
    k = torch.randn(kb, tk, hk, d, generator=g).transpose(1, 2) if model_layout else torch.randn(kb, hk, tk, d, generator=g)
    v = torch.randn(kb, hk, tk, d, generator=g)
    q_, k, v = (t.to(dtype) for t in (q_, k, v))
    keep = None if mask == "none" else torch.rand(1 if mask == "1,S" else b, tk, generator=g) > 0.4
    if mask == "B,S float":
        keep = keep.float()
    out = short_attention(q_, k, v, keep, d ** -0.5)
    if out is not None:  # the kernel's case (on a CPU with AVX-512): SDPA's numbers
        _close(out, _reference_attention(q_, k.expand(b, -1, -1, -1), v.expand(b, -1, -1, -1), keep, d ** -0.5))
    assert short_attention(*(t.to("meta") for t in (q_, k, v)), None, 1.0) is None
    # the whole attention with a broadcast mask of each kind, against SDPA
    if not kv_batch_one and dtype == torch.float32:
        allowed = None if keep is None else keep.to(torch.bool)
        got = scaled_dot_product_attention(q_, k, v, AttentionMask(None if allowed is None else allowed[:, None, None, :]))[0]
        want = F.scaled_dot_product_attention(q_, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                                              attn_mask=None if allowed is None else allowed[:, None, None, :])
        rows_seen = torch.ones(b, dtype=torch.bool) if allowed is None else allowed.any(-1).expand(b)
        _close(got[rows_seen], want[rows_seen])  # (a row with no key: NaN in SDPA, left out)


@FAST
@given(kind=st.sampled_from([2, 3, 8]), rows=st.integers(1, 20), nb=st.integers(1, 4), m=st.integers(1, 70),
       xdt=DTYPES, out_dt=st.sampled_from([torch.float32, torch.bfloat16]), transposed=st.booleans(),
       bad=st.sampled_from(["none", "kind", "cols", "strided", "dtype", "meta"]), seed=st.integers(0, 99))
def test_blocks(kind, rows, nb, m, xdt, out_dt, transposed, bad, seed):
    g = torch.Generator().manual_seed(seed)
    cols, size = 32 * nb, q.BLOCK_TYPES[kind][1]
    blocks = torch.randint(0, 256, (rows, nb, size), generator=g, dtype=torch.uint8)
    scales = (torch.rand(rows, nb, 2 if kind == 3 else 1, generator=g) * 0.02).half().view(torch.uint8)
    blocks[..., :scales.size(-1)] = scales
    blocks = blocks.view(rows, nb * size)
    ids = torch.randint(0, rows, (3, 2), generator=g)
    if bad != "none":
        args = {"kind": (blocks, 5, cols), "cols": (blocks, kind, cols + 32), "dtype": (blocks.view(torch.int8), kind, cols),
                "strided": (torch.cat([blocks, blocks], 1)[:, ::2], kind, cols), "meta": None}[bad]
        if args is not None:
            with pytest.raises(ValueError, match="dequantize_rows"):
                q.dequantize_rows(*args, ids)
            return
        out = q.dequantize_rows(blocks.to("meta"), kind, cols, ids.to("meta"), out_dt)
        assert out.device.type == "meta" and out.shape == (3, 2, cols) and out.dtype == out_dt
        return
    got = q.dequantize_rows(blocks, kind, cols, ids, out_dt)
    want = _torch_only(lambda: q.dequantize_rows(blocks, kind, cols, ids, out_dt))
    assert torch.equal(got, want) or (got.float() - want.float()).abs().max() <= 1e-6 * want.float().abs().max()
    lin = q.BlockLinear(blocks, kind, cols, rows)
    x = _layout(torch.randn(m, cols, generator=g), transposed).to(xdt)
    ref = (x.double() @ _torch_only(lambda: lin.weight).double().T)
    tol = TOL[xdt] * 4 if xdt != torch.float32 else 1e-5
    got = lin(x)
    assert got.dtype == xdt and got.shape == (m, rows)
    assert (got.double() - ref).abs().max() <= tol * max(1.0, ref.abs().max().item())


@FAST
@given(rows=st.integers(1, 300), cols=st.sampled_from([64, 100, 128, 256]), dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       transposed=st.booleans(), wdt=st.sampled_from(["same", "fp32"]), seed=st.integers(0, 99))
def test_fused_rows(rows, cols, dtype, transposed, wdt, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(cols, rows, generator=g).t() if transposed else torch.randn(rows, cols, generator=g)
    x = x.to(dtype)
    w = (torch.rand(cols, generator=g) + 0.5).to(dtype if wdt == "same" else torch.float32)
    out = fused.rms_norm(x, w, 1e-5)
    if out is not None:
        _close(out, F.rms_norm(x, (cols,), w, 1e-5), dtype)
    up = torch.randn(rows, cols, generator=g).to(dtype)
    out = fused.silu_mul(x, up)
    if out is not None:
        _close(out, F.silu(x) * up, dtype)
    assert fused.rms_norm(x.to("meta"), w.to("meta"), 1e-5) is None
    # rope: (B, H, T, D) bf16 with any head/position strides
    t, d = max(1, rows // 8), 64
    xr = torch.randn(2, t, 4, d, generator=g).bfloat16()
    xr = xr.transpose(1, 2) if transposed else xr.permute(0, 2, 1, 3).contiguous()
    pos = torch.arange(t, dtype=torch.float32)[:, None] * torch.rand(d // 2, generator=g)
    cos, sin = torch.cat([pos, pos], -1).cos()[None, None], torch.cat([pos, pos], -1).sin()[None, None]
    out = fused.rope(xr, cos, sin)
    if out is not None:
        half = torch.cat((-xr[..., d // 2:], xr[..., :d // 2]), -1)
        _close(out, xr * cos.to(xr.dtype) + half * sin.to(xr.dtype), torch.bfloat16)
    # one vocabulary tile of a log-softmax
    logits = torch.randn(rows, cols * 8, generator=g).to(dtype)
    targets = torch.randint(0, cols * 8, (rows,), generator=g)
    run_max, run_sum, picked = torch.full((rows,), -torch.inf), torch.zeros(rows), torch.zeros(rows)
    if fused.lse_tile(logits, targets, 0, run_max, run_sum, picked):
        _close(run_max + run_sum.log(), logits.float().logsumexp(-1), torch.float32)
        assert torch.equal(picked, logits.float().gather(1, targets[:, None])[:, 0])


@settings(max_examples=10, deadline=None, database=None)
@given(h=st.sampled_from([2, 4]), hk=st.sampled_from([1, 2]), t=st.integers(1, 160), d=st.sampled_from([32, 64]),
       dtype=st.sampled_from([torch.bfloat16, torch.float32]), seed=st.integers(0, 99))
def test_causal_attention(h, hk, t, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q_ = torch.randn(1, t, h, d, generator=g).to(dtype).transpose(1, 2)
    k, v = (torch.randn(1, hk, t, d, generator=g).to(dtype) for _ in range(2))
    out = causal_attention(q_, k, v, d ** -0.5)
    if out is not None:
        want = F.scaled_dot_product_attention(q_.float(), k.float().repeat_interleave(h // hk, 1),
                                              v.float().repeat_interleave(h // hk, 1), is_causal=True)
        _close(out, want.to(dtype), dtype)


def _mutate(t: torch.Tensor, change: str) -> torch.Tensor:
    if change == "rows":
        return t[:-1]
    if change == "cols":
        return t[..., :-1] if t.dim() == 2 else t
    if change == "dtype":
        return t.to(torch.float64 if t.is_floating_point() else torch.int64)
    if change == "strided":  # the same values, every other element of a wider buffer
        return torch.stack([t, t], -1)[..., 0]
    return t.to("meta") if change == "meta" else t


@FAST
@given(rows=st.integers(0, 9), cols=st.integers(0, 9), which=st.sampled_from([None, 0, 1, 2, 3]),
       change=st.sampled_from(["rows", "cols", "dtype", "strided", "meta", "none"]), seed=st.integers(0, 99))
def test_the_door_refuses_or_is_right(rows, cols, which, change, seed):
    """Random mismatches of int8_dequant_rows's arguments: a KernelArgumentError naming it, or the right numbers."""
    if kernels.library() is None:
        return
    g = torch.Generator().manual_seed(seed)
    acc = torch.randint(-1000, 1000, (rows, cols), generator=g, dtype=torch.int32)
    args = [acc, torch.rand(rows, generator=g), torch.rand(cols, generator=g), torch.rand(cols, generator=g)]
    want = acc.double() * (args[1][:, None].double() * args[2].double()) + args[3].double()
    if which is not None:
        args[which] = _mutate(args[which], change)
    before = acc.clone()
    try:
        kernels.call("int8_dequant_rows", *args, rows, cols)
    except kernels.KernelArgumentError as err:
        assert "int8_dequant_rows" in str(err) and "expected" in str(err) and "got" in str(err)
        assert torch.equal(acc, before)  # nothing written
        return
    out = args[0].view(torch.float32)  # accepted: the mutation changed nothing C could misread (C sees flat rows)
    torch.testing.assert_close(out.reshape(rows, cols).double(), want, rtol=1e-5, atol=1e-4)
