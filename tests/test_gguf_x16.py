"""The batch-1 decode step's 4-bit products on weights repacked 16 rows at a time (nn/csrc/ggml_x16.c): the
layout holds the GGUF blocks' exact numbers, the product is the integer step's (x quantized per block of 32)
to fp32 rounding, and both decoders (`generate`'s modules and the torch-free one) take it."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import attnlab
from attnlab.inference import lean
from attnlab.inference.block_step import _packed_table
from attnlab.nn import kernels as door
from attnlab.nn import quantized as q
from attnlab.nn.kernel_signatures import KernelArgumentError

gguf = pytest.importorskip("gguf")
from gguf.quants import quantize  # noqa: E402
from test_gguf_quantized import write_tiny_quantized  # noqa: E402

pytestmark = pytest.mark.skipif(not q.available(), reason=f"no C compiler: {q.why_unavailable()}")
needs_vnni = pytest.mark.skipif(not door.active("ggml_x16") if q.available() else True,
                                reason="the repacked product needs AVX512-VNNI or AVX2 (this CPU or build lacks it)")
BS = {2: 18, 3: 20}


def _blocks(kind: int, n: int, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n, k)) * rng.uniform(0.02, 0.3, (n, 1))).astype(np.float32)
    return quantize(w, gguf.GGMLQuantizationType.Q4_0 if kind == 2 else gguf.GGMLQuantizationType.Q4_1)


def _fields(blocks: np.ndarray, kind: int, n: int, k: int):
    """(d, m, codes) of GGUF blocks: fp16 (n, nb), fp16 (n, nb) (Q4_0: None), uint8 (n, k)."""
    nb = k // 32
    raw = blocks.reshape(n, nb, BS[kind])
    d = raw[:, :, 0:2].copy().view(np.float16)[..., 0]
    m = raw[:, :, 2:4].copy().view(np.float16)[..., 0] if kind == 3 else None
    qs = raw[:, :, 4 if kind == 3 else 2:]
    codes = np.concatenate([qs & 15, qs >> 4], axis=-1).reshape(n, k)  # byte j: weight j, weight j + 16
    return d, m, codes


def _unpack(packed: np.ndarray, n: int, k: int):
    """(d, m, codes) read back from the repacked layout (ggml_x16.c's comment)."""
    nb = k // 32
    g = packed.reshape(n // 16, nb, 320)
    d = g[:, :, :32].copy().view(np.float16).transpose(0, 2, 1).reshape(n, nb)
    m = g[:, :, 32:64].copy().view(np.float16).transpose(0, 2, 1).reshape(n, nb)
    parts = g[:, :, 64:].reshape(n // 16, nb, 4, 16, 4)  # (group, block, part i, row r, byte t)
    lo = (parts & 15).transpose(0, 3, 1, 2, 4).reshape(n, nb, 16)  # weights 4i + t
    hi = (parts >> 4).transpose(0, 3, 1, 2, 4).reshape(n, nb, 16)  # weights 16 + 4i + t
    return d, m, np.concatenate([lo, hi], axis=-1).reshape(n, k)


def _pack(blocks: np.ndarray, kind: int, n: int, k: int, parts: int = 1) -> torch.Tensor:
    out = torch.empty(n * k // 32 * 20, dtype=torch.uint8)
    door.call("ggml_x16_pack", kind, torch.from_numpy(blocks.reshape(-1)), n, k, out, parts)
    return out


@pytest.mark.parametrize("kind", [2, 3])
@pytest.mark.parametrize("n,k", [(16, 32), (48, 96), (192, 576)])
def test_the_repacked_layout_holds_the_blocks_numbers(kind, n, k):
    blocks = _blocks(kind, n, k, seed=n + k + kind)
    d, m, codes = _fields(blocks, kind, n, k)
    packed = _pack(blocks, kind, n, k)
    assert torch.equal(_pack(blocks, kind, n, k, parts=2), packed)  # the groups split over threads
    pd, pm, pcodes = _unpack(packed.numpy(), n, k)
    assert np.array_equal(pd.view(np.uint16), d.view(np.uint16)) and np.array_equal(pcodes, codes)
    want_m = m if kind == 3 else (np.float32(-8.0) * d.astype(np.float32)).astype(np.float16)
    assert np.array_equal(pm.view(np.uint16), want_m.view(np.uint16))


def test_q4_0_offsets_are_exact_for_every_fp16_scale_that_fits():
    """m = -8 d for each finite fp16 d with |8 d| <= 65504 (subnormals, both signs, zero), bit for bit; a scale
    whose offset overflows fp16 refuses the matrix (the step then keeps the GGUF blocks)."""
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    vals = bits.view(np.float16)
    vals = vals[np.isfinite(vals)]
    d = vals[np.abs(vals.astype(np.float32)) * 8 <= 65504]
    n, nb = 32, -(-d.size // 32)  # (57,344 scales: 32 rows of 1,792 blocks)
    d = np.concatenate([d, np.zeros(n * nb - d.size, np.float16)]).reshape(n, nb)
    raw = np.zeros((n, nb, 18), np.uint8)
    raw[:, :, :2] = d.view(np.uint8).reshape(n, nb, 2)
    packed = _pack(raw, 2, n, nb * 32).numpy()
    _, pm, _ = _unpack(packed, n, nb * 32)
    assert np.array_equal(pm.view(np.uint16), (np.float32(-8.0) * d.astype(np.float32)).astype(np.float16).view(np.uint16))
    for row in (3, 19):  # in the first or the second group (either thread's half with two)
        bad = raw.copy()
        bad[row, 5, :2] = np.array([8192.0], np.float16).view(np.uint8)  # -8 x 8192 = -65536: beyond fp16
        for parts in (1, 2):
            with pytest.raises(RuntimeError, match="ggml_x16_pack failed"):
                _pack(bad, 2, n, nb * 32, parts)


def test_the_door_refuses_what_the_kernel_does_not_take():
    blocks = _blocks(3, 48, 64, seed=1)
    out = torch.empty(48 * 2 * 20, dtype=torch.uint8)
    with pytest.raises(KernelArgumentError, match="N a positive multiple of 16"):
        door.call("ggml_x16_pack", 3, torch.from_numpy(blocks.reshape(-1))[:40 * 2 * 20], 40, 64, out[:40 * 40], 1)
    with pytest.raises(KernelArgumentError, match="kind 2"):
        door.call("ggml_x16_pack", 8, torch.zeros(48 * 2 * 34, dtype=torch.uint8), 48, 64, out, 1)
    with pytest.raises(KernelArgumentError):  # a buffer shorter than N rows of K / 32 blocks
        door.call("ggml_x16_pack", 3, torch.from_numpy(blocks.reshape(-1))[:-1], 48, 64, out, 1)
    with pytest.raises(KernelArgumentError, match="K a multiple of 32 up to 65,536"):
        door.call("ggml_x16_step", torch.zeros(16 * 65568 // 32 * 20, dtype=torch.uint8), torch.zeros(65568), 65568,
                  16, torch.zeros(16), 1)


def _reference(blocks: np.ndarray, kind: int, n: int, k: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The integer step in float64 on x quantized as the kernel does (fp32 scale, round half to even), and the
    sum of the magnitudes of its terms (the scale of its fp32 rounding)."""
    nb = k // 32
    xb = x.reshape(nb, 32)
    amax = np.abs(xb).max(-1).astype(np.float32)
    dx = (amax / np.float32(127)).astype(np.float32)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    qx = np.clip(np.rint((xb * inv[:, None]).astype(np.float32)), -128, 127).astype(np.int64)
    d, m, codes = _fields(blocks, kind, n, k)
    d = d.astype(np.float64)
    m = m.astype(np.float64) if kind == 3 else -8.0 * d
    dots = np.einsum("nbj,bj->nb", codes.reshape(n, nb, 32).astype(np.int64), qx)
    scaled, offsets = d * dx * dots, m * (dx * qx.sum(-1))  # (Q4_0's two nearly cancel: both count in the scale)
    return (scaled + offsets).sum(-1), (np.abs(scaled) + np.abs(offsets)).sum(-1)


@needs_vnni
@pytest.mark.parametrize("kind", [2, 3])
@pytest.mark.parametrize("n,k", [(16, 32), (48, 96), (192, 576), (1536, 576), (576, 1536), (16, 65536)])
def test_the_repacked_product_is_the_integer_step(kind, n, k):
    blocks = _blocks(kind, n, k, seed=7 * n + k + kind)
    packed = _pack(blocks, kind, n, k)
    rng = np.random.default_rng(n * k)
    x = (rng.standard_normal(k) * rng.uniform(0.1, 3.0, k)).astype(np.float32)
    x[:32] = 0.0  # a block of zeros: scale 0, no division by it
    xt = torch.from_numpy(x)
    outs = []
    for parts in (1, 2, 3):
        out = torch.full((n,), float("nan"))
        door.call("ggml_x16_step", packed, xt, k, n, out, parts)
        outs.append(out)
    assert all(torch.equal(outs[0], o) for o in outs[1:])  # the split over threads keeps the bits
    want, scale = _reference(blocks, kind, n, k, x)
    assert np.all(np.abs(outs[0].numpy() - want) <= 1e-6 * scale + 1e-7)
    old = torch.empty(n)  # the GGUF blocks' integer path: the same sums in another fp32 order
    door.call("ggml_matvec_step", kind, xt, k, torch.from_numpy(blocks.reshape(-1)), n, old)
    assert np.all(np.abs(old.numpy() - want) <= 1e-6 * scale + 1e-7)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = write_tiny_quantized(tmp_path_factory.mktemp("x16") / "tiny.gguf")
    return path, attnlab.load(path, quantized=True)


@needs_vnni
def test_both_decoders_take_the_repacked_weights(tiny):
    """Q4_0 and Q4_1 matrices are repacked (once), Q8_0 ones are not; the torch-free decoder's steps with them
    equal its steps without them to fp32 rounding, fed the same tokens."""
    path, model = tiny
    keep, table = _packed_table(model)
    kinds = [layer.get_submodule(n).kind for layer in model.backbone.layers
             for n in ("attn.q", "attn.k", "attn.v", "attn.o", "ffn.gate", "ffn.up", "ffn.down")]
    assert [p is not None for p in table] == [kd in (2, 3) for kd in kinds] and 8 in kinds
    assert model.backbone.layers[0].attn.q.packed_x16() is keep[0]  # kept, not repacked per call
    dec, why = lean.LeanDecoder.open(path)
    assert dec is not None, why
    assert [a is not None for a in dec._packed] == [kd in (2, 3) for kd in kinds]
    ids, feed = list(range(3, 40)), [5, 17, 200, 9, 63, 1, 250, 31]
    runs = []
    for table in (dec.packed, (lean._p * len(dec._packed))()):
        dec.packed = table
        rows = [dec.start(ids, len(feed) + 1)] + [dec.step(t) for t in feed]
        runs.append(np.stack(rows))
    assert np.array_equal(runs[0][0], runs[1][0])  # the prompt's logits: fp32 products either way
    np.testing.assert_allclose(runs[0], runs[1], rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def avx2_build(tmp_path_factory):
    """The kernels built for AVX2 without AVX-512 (the build an AVX2-only CPU gets), on a CPU that can run it:
    so an AVX-512 machine tests the AVX2 kernel too."""
    import ctypes
    import subprocess

    from attnlab.nn import kernel_build
    if not {"avx2", "fma", "f16c"} <= door.cpu_flags():
        pytest.skip("this CPU cannot run an AVX2 build")
    cc, why = kernel_build.find_compiler()
    if cc is None:
        pytest.skip(why)
    out = tmp_path_factory.mktemp("avx2") / "kernels-avx2.so"
    cmd = [cc, "-O2", "-mavx2", "-mfma", "-mf16c", "-shared", "-fPIC", "-pthread", "-o", str(out),
           *map(str, kernel_build.SOURCES), "-lm"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-800:]
    lib = ctypes.CDLL(str(out))
    assert lib.ggml_x16_supported() == 1
    return lib


@pytest.mark.parametrize("kind", [2, 3])
@pytest.mark.parametrize("n,k", [(16, 32), (48, 96), (1536, 576), (576, 1536)])
def test_the_avx2_kernel_is_the_integer_step(avx2_build, kind, n, k):
    import ctypes
    p, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
    blocks = np.ascontiguousarray(_blocks(kind, n, k, seed=3 * n + k + kind))
    packed = np.empty(n * k // 32 * 20, np.uint8)
    assert avx2_build.ggml_x16_pack(i32(kind), p(blocks.ctypes.data), i64(n), i64(k), p(packed.ctypes.data),
                                    i32(2)) == 0
    x = np.random.default_rng(k).standard_normal(k).astype(np.float32)
    outs = []
    for parts in (1, 2):
        out = np.full(n, np.nan, np.float32)
        assert avx2_build.ggml_x16_step(p(packed.ctypes.data), p(x.ctypes.data), i64(k), i64(n),
                                        p(out.ctypes.data), i32(parts)) == 0
        outs.append(out)
    assert np.array_equal(outs[0], outs[1])
    want, scale = _reference(blocks, kind, n, k, x)
    assert np.all(np.abs(outs[0] - want) <= 1e-6 * scale + 1e-7)
    old = np.empty(n, np.float32)  # the AVX2 build's unpacked integer path: same sums, x quantized alike
    avx2_build.ggml_matvec_step(i32(kind), p(x.ctypes.data), i64(k), p(blocks.ctypes.data), i64(n), p(old.ctypes.data))
    assert np.all(np.abs(old - want) <= 1e-6 * scale + 1e-7)
