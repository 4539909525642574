"""Without a C compiler, or on a CPU that lacks a kernel's instructions, every entry point to the C kernels
(nn/kernels.py) takes its PyTorch path with the kernel path's numbers, and one line per kernel says so."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnlab.nn import AttentionMask, fused, kernel_build, kernels, scaled_dot_product_attention
from attnlab.nn import quantized as q
from attnlab.nn.cpu_attention import short_attention
from attnlab.nn.int8 import INT8_DOT, Int8Linear, quantize_rows, quantize_rows_u7
from attnlab.nn.norms import RMSNorm
from attnlab.nn.positions import RotaryEmbedding, apply_rotary

pytestmark = pytest.mark.skipif(kernels.library() is None, reason="no C compiler: no kernel path to compare with")
LINE = "attnlab: C kernel {} unavailable ({}); using the PyTorch path"


@pytest.fixture(autouse=True)
def _fresh():
    """Each test decides anew what runs, and leaves the real state behind for the next file."""
    kernels.reset()
    with torch.no_grad():
        yield
    kernels.reset()


def _q8_blocks(rows: int, cols: int) -> torch.Tensor:
    rng = np.random.default_rng(3)
    nb = cols // 32
    out = np.zeros((rows, nb, 34), dtype=np.uint8)
    out[:, :, :2] = rng.uniform(0.001, 0.02, (rows, nb)).astype(np.float16)[..., None].view(np.uint8)
    out[:, :, 2:] = rng.integers(-127, 128, (rows, nb, 32)).astype(np.int8).view(np.uint8)
    return torch.from_numpy(out.reshape(rows, nb * 34))


def _q4_blocks(rows: int, cols: int, kind: int) -> torch.Tensor:
    rng = np.random.default_rng(kind)
    nb, size = cols // 32, q.BLOCK_TYPES[kind][1]
    out = rng.integers(0, 256, (rows, nb, size)).astype(np.uint8)
    out[:, :, :2] = rng.uniform(0.001, 0.02, (rows, nb)).astype(np.float16)[..., None].view(np.uint8)
    if kind == 3:
        out[:, :, 2:4] = rng.uniform(-0.1, 0.1, (rows, nb)).astype(np.float16)[..., None].view(np.uint8)
    return torch.from_numpy(out.reshape(rows, nb * size))


def _everything() -> dict:
    """Every Python entry point over a C kernel, on fixed inputs: name -> output(s)."""
    g = torch.Generator().manual_seed(0)
    out = {}
    torch.manual_seed(0)  # the Linear's initial weights
    lin = torch.nn.Linear(96, 72)
    smooth = torch.rand(96, generator=g) + 0.5
    x = torch.randn(2, 9, 96, generator=g)
    for codes in ("s8", "u7"):  # (u7: the AVX2 kernel's codes)
        layer = Int8Linear.from_linear(lin, smooth, codes)
        out[f"int8_linear_{codes}"] = layer(x)
    whole_tiles = Int8Linear.from_linear(torch.nn.Linear(128, 48), None, "s8")  # (the AMX kernel's shapes)
    out["int8_linear_tiles"] = whole_tiles(torch.randn(40, 128, generator=g), activation="gelu")
    out["quantize_rows"] = quantize_rows(x.reshape(-1, 96), layer.factors)
    out["quantize_rows_u7"] = quantize_rows_u7(x.reshape(-1, 96), layer.factors)
    for dtype in (torch.float32, torch.bfloat16):
        h = torch.randn(4, 64, 128, generator=g).to(dtype)
        norm = RMSNorm(128).to(dtype)
        norm.weight.copy_(torch.rand(128, generator=g) + 0.5)
        out[f"rms_norm_{dtype}"] = norm(h)
        gate, up = torch.randn(2, 64, 256, generator=g).to(dtype), torch.randn(2, 64, 256, generator=g).to(dtype)
        silu = fused.silu_mul(gate, up)
        out[f"silu_{dtype}"] = silu if silu is not None else F.silu(gate) * up
    cos, sin = RotaryEmbedding(64)(torch.arange(64)[None])
    qh = torch.randn(2, 64, 4, 64, generator=g).bfloat16().transpose(1, 2)
    out["rope"] = apply_rotary(qh, cos, sin)
    logits = torch.randn(40, 600, generator=g)
    targets = torch.randint(0, 600, (40,), generator=g)
    run_max, run_sum, picked = torch.full((40,), -torch.inf), torch.zeros(40), torch.zeros(40)
    if not fused.lse_tile(logits, targets, 0, run_max, run_sum, picked):
        run_max, run_sum = logits.amax(-1), (logits - logits.amax(-1, keepdim=True)).exp().sum(-1)
        picked = logits.gather(1, targets[:, None])[:, 0]
    out["lse"] = (run_max + run_sum.log(), picked)
    for kind, blocks in ((8, _q8_blocks(40, 96)), (2, _q4_blocks(40, 96, 2)), (3, _q4_blocks(40, 96, 3))):
        block_lin = q.BlockLinear(blocks, kind, 96, 40)
        for m in (1, 5, 70):
            out[f"block_linear_{kind}_{m}"] = block_lin(torch.randn(m, 96, generator=g))
        ids = torch.tensor([[3, 39], [0, 0]])
        out[f"rows_{kind}"] = q.dequantize_rows(blocks, kind, 96, ids)
        out[f"rows_bf16_{kind}"] = q.dequantize_rows(blocks, kind, 96, ids, torch.bfloat16)
        out[f"embedding_{kind}"] = q.BlockEmbedding(blocks, kind, 40, 96)(ids)
        # the batch-1 step's repacked weights (no numbers of their own here): asked for 4-bit blocks only
        q.BlockLinear(_q4_blocks(48, 96, kind) if kind != 8 else _q8_blocks(48, 96), kind, 96, 48).packed_x16()
    qa = torch.randn(3, 4, 12, 32, generator=g)
    keep = torch.rand(3, 12, generator=g) > 0.3
    out["short_attention"] = scaled_dot_product_attention(qa, qa, qa, AttentionMask.build(keep, 12, 12))[0]
    qc = torch.randn(1, 4, 256, 64, generator=g).bfloat16()
    out["causal_attention"] = scaled_dot_product_attention(qc, qc, qc, AttentionMask(is_causal=True))[0]
    return out


def _assert_same(got: dict, want: dict) -> None:
    """The kernels' own test tolerances: fp32 rounding, one bf16 ulp, the block sums' few ulps."""
    for name, ref in want.items():
        for a, b in zip(*(v if isinstance(v, tuple) else (v,) for v in (got[name], ref))):
            assert a.dtype == b.dtype and a.shape == b.shape, name
            if a.dtype in (torch.int8, torch.int64):
                assert torch.equal(a, b), name
            elif a.dtype == torch.bfloat16:
                torch.testing.assert_close(a.float(), b.float(), rtol=2 ** -7, atol=2e-2, msg=name)
            else:
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=name)


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "attnlab.kernels"]


@pytest.mark.parametrize("how", ["empty PATH", "CC missing", "no compiler found"])
def test_without_a_compiler_every_entry_point_takes_torchs_path(how, monkeypatch, tmp_path, caplog):
    want = _everything()
    assert kernels.kernel_reason("int8_rows") == ""
    kernels.reset()
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path))  # (a cached build must not stand in for a compiler)
    if how == "empty PATH":
        monkeypatch.delenv("CC", raising=False)
        monkeypatch.setenv("PATH", str(tmp_path))
        reason = "no C compiler found"
    elif how == "CC missing":
        monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
        reason = f"CC={tmp_path / 'no-such-cc'} is not an executable program"
    else:
        monkeypatch.setattr(kernel_build, "find_compiler", lambda: (None, "no C compiler found (faked)"))
        reason = "no C compiler found (faked)"
    caplog.set_level(logging.WARNING, logger="attnlab.kernels")
    caplog.clear()  # (the reference run above wrote its own lines)
    _assert_same(_everything(), want)
    _everything()  # a second round writes nothing more
    status = kernels.kernel_status()
    assert [s["name"] for s in status] == list(kernels.KERNELS)
    assert all(not s["active"] and reason in s["reason"] for s in status)
    assert not q.available() and reason in q.why_unavailable()
    lines = _lines(caplog)
    # int8_gemm is AVX2's product: a CPU with int8 dot products (VNNI, AMX) never asks for it, so says nothing
    # int8_amx is asked for only where the CPU has AMX-INT8
    needs_avx2_product = not any(f in kernels.cpu_flags() for f in INT8_DOT)
    # ggml_x16 (the step's repacked weights) is asked only where the block kernels run
    asked = {"int8_gemm": needs_avx2_product, "int8_amx": "amx_int8" in kernels.cpu_flags(), "ggml_x16": False}
    for name in ("int8_rows", "int8_gemm", "int8_amx", "fused_rows", "ggml_blocks", "short_attention",
                 "causal_attention", "ggml_x16"):
        want_lines = int(asked.get(name, True))
        assert sum(line.startswith(f"attnlab: C kernel {name} ") for line in lines) == want_lines, (name, lines)
    assert any(line.startswith("attnlab: C kernel int8_rows unavailable (") and reason in line
               and line.endswith("; using the PyTorch path") for line in lines)


def test_a_cpu_without_the_instructions_gets_torchs_path(monkeypatch, tmp_path, caplog):
    want = _everything()
    kernels.reset()
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path))  # built anew: the cache key holds the CPU's flags
    monkeypatch.setattr(kernels, "cpu_flags", lambda: {"fpu", "sse", "sse2", "sse4_2"})
    caplog.set_level(logging.INFO, logger="attnlab.kernels")
    caplog.clear()  # (the reference run above wrote its own lines)
    _assert_same(_everything(), want)
    _everything()
    status = {s["name"]: s for s in kernels.kernel_status()}
    assert status["short_attention"] == {"name": "short_attention", "active": False,
                                         "reason": "this CPU lacks avx2, fma"}
    assert status["causal_attention"]["reason"] == "this CPU lacks avx512f, avx512_bf16"
    assert status["int8_gemm"]["reason"] == "this CPU lacks avx2, fma"
    assert status["int8_amx"]["reason"] == "this CPU lacks amx_int8, amx_tile, avx512f"
    assert status["int8_vnni"]["reason"] == "this CPU lacks avx512f, avx512bw, avx512_vnni"
    assert status["ggml_x16"]["reason"] == "this CPU lacks avx2, fma, f16c"
    assert status["int8_rows"]["active"] and status["fused_rows"]["active"]  # portable C: no special needs
    assert status["paged_attention"]["active"]
    assert list(tmp_path.glob("kernels/attnlab-kernels-*.so"))
    lines = _lines(caplog)
    assert lines.count(LINE.format("short_attention", "this CPU lacks avx2, fma")) == 1
    assert lines.count(LINE.format("causal_attention", "this CPU lacks avx512f, avx512_bf16")) == 1
    assert lines.count(LINE.format("ggml_x16", "this CPU lacks avx2, fma, f16c")) == 1
    assert not any("int8_rows" in line for line in lines)
    # the CPU's own limits are info, not warnings: every command on an AVX2 machine would repeat them
    assert not [r for r in caplog.records if r.name == "attnlab.kernels" and r.levelno >= logging.WARNING]


def test_kernel_status_says_what_runs_and_why():
    status = kernels.kernel_status()
    assert [s["name"] for s in status] == ["ggml_blocks", "int8_rows", "int8_gemm", "int8_amx", "short_attention",
                                           "fused_rows", "causal_attention", "paged_attention", "dropout",
                                           "ggml_x16", "int8_vnni"]
    for s in status:
        assert set(s) == {"name", "active", "reason"} and isinstance(s["active"], bool) and s["reason"]
        assert s["active"] == s["reason"].startswith("built with ")
    # status alone writes no line: `attnlab env` may call it to report
    assert short_attention(torch.randn(1, 1, 2, 16), torch.randn(1, 1, 2, 16), torch.randn(1, 1, 2, 16), None,
                           1.0) is None or status[4]["active"]
