"""The block kernels of csrc/ggml_blocks.c on the path this CPU takes (AVX512, AVX2 or portable C), against the
fp32 product with the gguf package's own dequantization: the exact product (fp32 activations) to rounding,
and the batch-1 decode step's integer product (int8 activations, VNNI or AVX2) within the rounding of x.
Shapes cover every tile and remainder of the kernel: odd N, M = 1..9 and past 64, K of one block and long
rows. Also: which path and which GEMM threshold a CPU's flags select."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab.nn import kernels as door
from attnlab.nn import quantized as q

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize, quantize  # noqa: E402

TYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 8}
INT8_PATHS = ("avx512-vnni", "avx2")
needs_kernel = pytest.mark.skipif(not q.available(), reason=f"no C compiler: {q.why_unavailable()}")


@pytest.mark.parametrize("flags,path,rows", [
    ({"avx2", "fma", "f16c", "avx512f", "avx512vl", "avx512_vnni"}, "avx512-vnni", 64),
    ({"avx2", "fma", "f16c", "avx512f", "avx512vl"}, "avx512", 64),
    ({"sse4_2", "avx", "avx2", "fma", "f16c", "bmi2"}, "avx2", 96),
    ({"avx", "avx2", "f16c"}, "portable", 1),       # no FMA: the C file's AVX2 path is not compiled
    ({"sse2", "sse4_2"}, "portable", 1),
    (set(), "portable", 1),                          # flags unknown: the build is portable too
])
def test_the_cpu_flags_pick_the_path_and_the_gemm_threshold(flags, path, rows):
    assert q.block_path(flags) == path
    assert q.gemm_rows(flags) == rows


def test_this_cpu_gets_its_threshold():
    assert q.GEMM_ROWS == q.gemm_rows(q.cpu_flags())


def _case(name: str, n: int, k: int, m: int, seed: int):
    rng = np.random.default_rng(seed)
    kind = gguf.GGMLQuantizationType[name]
    blocks = quantize((rng.standard_normal((n, k)) * 0.1).astype(np.float32), kind)
    w = torch.from_numpy(dequantize(blocks, kind).astype(np.float32))
    x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32))
    return torch.from_numpy(blocks), w, x


def _exact_ok(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> bool:
    want = x.double() @ w.double().T
    return bool(((got.double() - want).abs().max() <= 1e-5 * max(1.0, want.abs().max().item())).item())


def _int8_ok(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> bool:
    """x rounded to int8 per block of 32 moves each x_j by at most half a step, max|x_block| / 254."""
    k = x.size(-1)
    want = x.double() @ w.double().T
    step = x.double().view(k // 32, 32).abs().amax(-1) / 254
    wsum = w.double().abs().view(w.size(0), k // 32, 32).sum(-1)
    return bool(((got.double() - want).abs() <= wsum @ step + 1e-5 * max(1.0, want.abs().max().item())).all())


def _step(kind: int, x: torch.Tensor, blocks: torch.Tensor, n: int) -> torch.Tensor:
    out = torch.empty(1, n)
    door.call("ggml_matvec_step", kind, x.reshape(-1), x.numel(), blocks, n, out)
    return out


@needs_kernel
@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("k", [32, 2048])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7, 8, 9, 64, 67])  # every tile: 8 rows, then 4, 2, 1
def test_kernel_rows_equal_the_dequantized_product(name, k, m):
    n = 13  # odd: tiles of 4 and of 2 weight rows, and remainders
    blocks, w, x = _case(name, n, k, m, seed=TYPES[name] * 1000 + k + m)
    out = torch.empty(m, n)
    door.call("ggml_matmul", TYPES[name], x, m, k, blocks, n, out)
    assert _exact_ok(out, x, w)


@needs_kernel
@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("n,k", [(1, 32), (7, 32), (13, 96), (9, 2048)])
def test_decode_step_row_int8_by_default_and_exact_on_request(name, n, k):
    blocks, w, x = _case(name, n, k, 1, seed=TYPES[name] * 77 + n + k)
    exact = torch.empty(1, n)
    door.call("ggml_matmul", TYPES[name], x, 1, k, blocks, n, exact)
    with q.exact_products(False):
        fast = _step(TYPES[name], x, blocks, n)
    assert _int8_ok(fast, x, w)
    # the integer path ran where the CPU has one (x's rounding shows), and only there
    assert torch.equal(fast, exact) != (q.block_path() in INT8_PATHS)
    with q.exact_products():
        assert torch.equal(_step(TYPES[name], x, blocks, n), exact)


@needs_kernel
def test_rows_past_2048_blocks_take_the_exact_product():
    """The integer path quantizes x into a 2048-block buffer on the stack; longer rows stay fp32."""
    blocks, w, x = _case("Q4_1", 3, 32 * 2050, 1, seed=5)
    exact = torch.empty(1, 3)
    door.call("ggml_matmul", 3, x, 1, x.size(1), blocks, 3, exact)
    assert _exact_ok(exact, x, w)
    with q.exact_products(False):
        assert torch.equal(_step(3, x, blocks, 3), exact)


@needs_kernel
def test_int8_extremes_do_not_saturate():
    """Q8_0 weights of -128 (valid in a file though llama.cpp's quantizer never writes them) against x blocks
    of +-max (x quantized to +-127): |w| * |x| pairs reach 2*128*127, just under the int16 limit; a zero
    block of x (scale 0) must give 0, not NaN."""
    n, k = 5, 96
    d = np.full((n, k // 32, 1), 0.01, np.float16).view(np.uint8)
    qs = np.full((n, k // 32, 32), -128, np.int8)
    qs[1] = 127
    qs[2, :, ::2] = -128
    qs[2, :, 1::2] = 127
    blocks = torch.from_numpy(np.concatenate([d, qs.view(np.uint8)], axis=-1).reshape(n, -1).copy())
    w = q.dequantize_rows(blocks, 8, k, torch.arange(n))
    x = torch.empty(1, k)
    x[0, :32] = -3.0                       # every pair at the extreme: (-128) * (-127) twice
    x[0, 32:64] = 0.0                      # a zero block
    x[0, 64:] = torch.linspace(-2, 2, 32)  # a mixed one
    with q.exact_products(False):
        fast = _step(8, x, blocks, n)
    assert torch.isfinite(fast).all() and _int8_ok(fast, x, w)
    for name in ("Q4_0", "Q4_1"):  # 4-bit codes 15 against x = +-127: the largest unsigned x signed pairs
        kind, size = TYPES[name], q.BLOCK_TYPES[TYPES[name]][1]
        raw = quantize(np.ones((n, k), np.float32), gguf.GGMLQuantizationType[name]).reshape(n, k // 32, size)
        raw[:, :, size - 16:] = 0xFF
        b = torch.from_numpy(raw.reshape(n, -1).copy())
        wq = q.dequantize_rows(b, kind, k, torch.arange(n))
        xs = torch.full((1, k), 5.0)
        xs[0, 32:64] = -5.0
        with q.exact_products(False):
            assert _int8_ok(_step(kind, xs, b, n), xs, wq)


@needs_kernel
@pytest.mark.parametrize("kind", [2, 3, 8])
def test_block_product_split_over_threads_equals_one_call(kind):
    """BlockLinear's product split by output columns over threads (ggml_matmul_cols) gives exactly the
    one-thread product, for column ranges that cut anywhere, and an empty range writes nothing."""
    from attnlab.nn import kernels as door
    from attnlab.nn.kernel_signatures import BLOCK_BYTES
    g = torch.Generator().manual_seed(kind)
    n, k, m = 77, 64, 9
    blocks = torch.randint(0, 256, (n, k // 32 * BLOCK_BYTES[kind]), generator=g, dtype=torch.uint8)
    blocks.view(n, -1, BLOCK_BYTES[kind])[:, :, :2] = torch.tensor([0, 0x20], dtype=torch.uint8)  # d = 2^-7
    if kind == 3:
        blocks.view(n, -1, BLOCK_BYTES[kind])[:, :, 2:4] = torch.tensor([0, 0x20], dtype=torch.uint8)
    x = torch.randn(m, k, generator=g)
    whole = torch.empty(m, n)
    door.call("ggml_matmul", kind, x, m, k, blocks, n, whole)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            out = torch.full((m, n), float("nan"))
            door.call("ggml_matmul_cols", kind, x, m, k, blocks, n, out)
            assert torch.equal(out, whole), threads
    finally:
        torch.set_num_threads(before)
    lib = door.library()
    out = torch.full((m, n), 7.0)
    for start, end in ((0, 30), (30, 31), (31, 31), (31, 77)):
        assert lib.ggml_matmul_cols(kind, x.data_ptr(), m, k, blocks.data_ptr(), n, out.data_ptr(), start, end) == 0
    assert torch.equal(out, whole)
    assert lib.ggml_matmul_cols(kind, x.data_ptr(), m, k, blocks.data_ptr(), n, out.data_ptr(), 5, 78) == -1
