"""The checked door to the C kernels (nn/kernels.py): what once reached C unchecked is now refused with an
error naming the function, the argument, what was expected and what came, or takes the PyTorch path with
the right numbers; C failures raise; the build cache key covers the compiler, its flags and the CPU."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
from torch import nn

from attnlab.nn import kernel_build, kernels
from attnlab.nn import quantized as q
from attnlab.nn.cpu_attention import short_attention
from attnlab.nn.int8 import Int8Linear

needs_library = pytest.mark.skipif(kernels.library() is None, reason="no C compiler: nothing to check before C")


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


def _q8_blocks(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    """Q8_0 blocks by hand: fp16 scale then 32 int8 codes per block of 32 weights."""
    rng = np.random.default_rng(seed)
    nb = cols // 32
    out = np.zeros((rows, nb, 34), dtype=np.uint8)
    out[:, :, :2] = np.full((rows, nb), 0.01, dtype=np.float16)[..., None].view(np.uint8)
    out[:, :, 2:] = rng.integers(-127, 128, (rows, nb, 32)).astype(np.int8).view(np.uint8)
    return torch.from_numpy(out.reshape(rows, nb * 34))


# ---- Int8Linear: buffers converted by .to(dtype) ------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_int8_linear_after_a_cast_of_the_model_keeps_its_numbers(dtype):
    g = torch.Generator().manual_seed(0)
    lin = nn.Linear(64, 40)
    layer = Int8Linear.from_linear(lin, torch.rand(64, generator=g) + 0.5)
    x = torch.randn(6, 64, generator=g)
    want = layer(x)
    layer.to(dtype)  # factors, weight_scale and bias become 2-byte floats; the int8 weights stay
    assert layer.factors.dtype == dtype
    got = layer(x.to(dtype)).float()
    # only the 2-byte rounding of x, the scales and the output may move it (once 2.35e33 off)
    assert (got - want).abs().max().item() <= 0.03 * want.abs().max().item()


# ---- short_attention: k/v of another batch, a broadcast key mask -----------------------------------------------

class _SpyLibrary:
    """Stands in for the compiled library with the short-attention kernel present: records what C would
    receive (and reads the key mask C would read, B x Tk bytes) instead of computing."""

    def __init__(self):
        self.calls = []

    def short_attention_supported(self):
        return 1

    def short_attention(self, *args):
        b, tk, keep = args[6], args[10], args[12]
        self.calls.append({"B": b, "Tk": tk, "keep": None if keep is None else ctypes.string_at(keep, b * tk)})
        return 0


@pytest.fixture
def spy(monkeypatch):
    lib = _SpyLibrary()
    kernels.reset()
    monkeypatch.setattr(kernels, "library", lambda: lib)
    monkeypatch.setitem(kernels.KERNELS["short_attention"], "_reason", "")  # active, whatever this CPU is
    yield lib
    monkeypatch.undo()
    kernels.reset()


def test_short_attention_never_hands_c_keys_of_another_batch(spy):
    q_ = torch.randn(4, 2, 5, 16)
    k1 = torch.randn(1, 2, 5, 16)  # SDPA broadcasts this; the kernel indexes it by the query's batch
    out = short_attention(q_, k1, k1, None, 0.25)
    assert out is None and spy.calls == []  # the caller runs SDPA
    with pytest.raises(ValueError, match=r"short_attention.*argument k: expected shape \(4, 2, 5, 16\), got \(1, 2, 5, 16\)"):
        kernels.call("short_attention", q_, k1, k1, 4, 2, 2, 5, 5, 16, None, 0.25, torch.empty(4 * 5 * 2 * 16))


def test_short_attention_expands_a_broadcast_key_mask(spy):
    q_ = torch.randn(4, 2, 5, 16)
    keep = torch.tensor([[True, False, True, True, False]])  # (1, S): one mask for every batch row
    short_attention(q_, q_, q_, keep, 0.25)
    assert len(spy.calls) >= 1  # one call per thread's share of the rows, each handed the whole expanded mask
    for call in spy.calls:
        assert call["B"] == 4 and call["keep"] == bytes([1, 0, 1, 1, 0] * 4)  # every row's mask, no bytes past it
    with pytest.raises(ValueError, match=r"short_attention.*argument keep: expected 20 elements, got 5"):
        kernels.call("short_attention", q_, q_, q_, 4, 2, 2, 5, 5, 16, keep.to(torch.uint8), 0.25,
                     torch.empty(4 * 5 * 2 * 16))


# ---- GGUF blocks: kind, cols, blocks, devices, C status ----------------------------------------------------

def test_dequantize_rows_refuses_what_does_not_match_its_blocks():
    blocks = _q8_blocks(4, 64)
    ids = torch.tensor([0, 3])
    with pytest.raises(ValueError, match="GGML type 5"):
        q.dequantize_rows(blocks, 5, 64, ids)  # once: C returned -1, unchecked, and torch.empty came back
    with pytest.raises(ValueError, match=r"\(4, 136\).*got torch.uint8 \(4, 68\)"):
        q.dequantize_rows(blocks, 8, 128, ids)  # once: read 2x past each row
    with pytest.raises(ValueError, match="multiple of the Q8_0 block size"):
        q.dequantize_rows(blocks, 8, 48, ids)
    with pytest.raises(ValueError, match="uint8"):
        q.dequantize_rows(blocks.view(torch.int8), 8, 64, ids)
    with pytest.raises(IndexError, match=r"\[0, 4\)"):
        q.dequantize_rows(blocks, 8, 64, torch.tensor([4]))


def test_block_modules_off_the_cpu_never_reach_c():
    blocks = _q8_blocks(6, 64)
    lin = q.BlockLinear(blocks, 8, 64, 6)
    x = torch.randn(3, 64)
    want = x @ lin.weight.T
    torch.testing.assert_close(lin(x), want, rtol=1e-5, atol=1e-5)
    lin.to("meta")  # stands in for model.cuda(): once, C was handed the device pointer (here NULL: a crash)
    with pytest.raises(ValueError, match="BlockLinear: blocks are on meta, the input on cpu"):
        lin(x)
    out = lin(x.to("meta"))  # all on one device that is not the CPU: torch's ops there
    assert out.device.type == "meta" and out.shape == (3, 6)
    meta_rows = q.dequantize_rows(blocks.to("meta"), 8, 64, torch.tensor([1, 2], device="meta"))
    assert meta_rows.device.type == "meta" and meta_rows.shape == (2, 64)
    emb = q.BlockEmbedding(blocks, 8, 6, 64).to("meta")
    assert emb(torch.tensor([0, 5], device="meta")).shape == (2, 64)


@needs_library
def test_a_c_failure_status_is_an_error_not_a_result():
    blocks = _q8_blocks(4, 64)
    out = torch.empty(1, 64)
    with pytest.raises(RuntimeError, match="ggml_rows failed with status -2"):  # id 9 of 4 rows: C says so
        kernels.call("ggml_rows", 8, blocks, 4, 64, torch.tensor([9]), 1, out)


# ---- the door itself -------------------------------------------------------------------------------------

@needs_library
@pytest.mark.parametrize("case,match", [
    ("meta", r"int8_dequant_rows, argument scale: expected a CPU tensor, got one on meta"),
    ("dtype", r"int8_dequant_rows, argument weight_scale: expected dtype torch.float32, got torch.bfloat16"),
    ("strided", r"int8_dequant_rows, argument acc: expected a contiguous tensor"),
    ("size", r"int8_dequant_rows, argument bias: expected 8 elements, got 7"),
    ("none", r"int8_dequant_rows, argument scale: expected a tensor, got None"),
    ("count", r"int8_dequant_rows: expected 6 arguments"),
    ("scalar", r"int8_dequant_rows, argument rows: expected a Python int, got Tensor"),
])
def test_the_door_names_function_argument_expected_and_got(case, match):
    acc, scale, ws, bias = torch.zeros(3, 8, dtype=torch.int32), torch.ones(3), torch.ones(8), torch.zeros(8)
    args = [acc, scale, ws, bias, 3, 8]
    if case == "meta":
        args[1] = scale.to("meta")
    elif case == "dtype":
        args[2] = ws.bfloat16()
    elif case == "strided":
        args[0] = torch.zeros(8, 3, dtype=torch.int32).t()
    elif case == "size":
        args[3] = bias[:7]
    elif case == "none":
        args[1] = None
    elif case == "count":
        args = args[:5]
    elif case == "scalar":
        args[4] = torch.tensor(3)
    before = acc.clone()
    with pytest.raises(ValueError, match=match):
        kernels.call("int8_dequant_rows", *args)
    assert torch.equal(acc, before)  # refused before C wrote anything


@needs_library
def test_strided_outputs_must_not_overlap():
    x = torch.randn(1, 2, 3, 4).bfloat16()
    cs = torch.randn(1, 3, 4)
    out = torch.empty(1, 1, 3, 4, dtype=torch.bfloat16).expand(1, 2, 3, 4)  # both heads on one memory
    with pytest.raises(ValueError, match="rope_rows, argument out: an output whose elements overlap"):
        kernels.call("rope_rows", x, cs, cs, 0, 0, out, 2, 3, 4, 1)


# ---- the build: cache key and flags ----------------------------------------------------------------------

def _plan(monkeypatch, **env):
    for key, value in env.items():
        monkeypatch.setattr(kernel_build, key, value)
    return kernels.build_plan()


@needs_library
def test_cache_key_covers_compiler_version_flags_and_cpu(monkeypatch, tmp_path):
    monkeypatch.delenv("ATTNLAB_KERNEL_SANITIZE", raising=False)
    base = kernels.build_plan()
    assert base["version"] and base["version"] in kernels.kernel_status()[0]["reason"]
    assert "-fsanitize=address,undefined" not in base["flags"]
    other_cc = _plan(monkeypatch, _compiler_version=lambda cc: "cc (Other) 99.1")
    monkeypatch.undo()
    other_cpu = _plan(monkeypatch, cpu_flags=lambda: {"fpu", "sse4_2"})
    monkeypatch.undo()
    monkeypatch.setenv("ATTNLAB_KERNEL_SANITIZE", "1")
    sanitized = kernels.build_plan()
    assert "-fsanitize=address,undefined" in sanitized["flags"]
    assert len({p["key"] for p in (base, other_cc, other_cpu, sanitized)}) == 4


@needs_library
def test_without_cpu_flags_the_build_is_portable(monkeypatch):
    """No /proc/cpuinfo: -march=native keyed by the architecture name alone could be run by a CPU that lacks
    its instructions, so the build is the architecture's baseline."""
    monkeypatch.delenv("ATTNLAB_KERNEL_SANITIZE", raising=False)
    plan = _plan(monkeypatch, cpu_flags=lambda: set())
    assert "-march=native" not in plan["flags"] and "-O3" in plan["flags"]
    assert "-march=native" in kernels.build_plan()["flags"] or not kernel_build.cpu_flags()


# ---- the sanitized build (make sanitize) -------------------------------------------------------------------

def _sanitizer_env() -> dict | None:
    import os
    import shutil
    import subprocess
    if shutil.which("gcc") is None:
        return None
    libs = [subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
            for name in ("libasan.so", "libstdc++.so")]
    if not all(os.path.isabs(lib) and os.path.exists(lib) for lib in libs):
        return None  # gcc answers the bare name when it has no such runtime
    return {**os.environ, "CC": "gcc", "ATTNLAB_KERNEL_SANITIZE": "1", "LD_PRELOAD": " ".join(libs),
            "ASAN_OPTIONS": "detect_leaks=0", "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
            "OMP_NUM_THREADS": "1"}


def test_the_sanitized_build_reports_what_the_door_keeps_out():
    """`make sanitize` runs the kernel tests on an ASan/UBSan build; here, that such a build is made and loaded,
    passes a call the door lets through, and stops a process at a read past a buffer (the door bypassed)."""
    import subprocess
    import sys
    env = _sanitizer_env()
    if env is None:
        pytest.skip("gcc with its AddressSanitizer runtime is not installed")
    script = (
        "import torch\n"
        "from attnlab.nn import kernels\n"
        "status = {s['name']: s for s in kernels.kernel_status()}\n"
        "assert status['int8_rows']['active'] and '-fsanitize=address,undefined' in status['int8_rows']['reason'], status\n"
        "acc, s, ws = torch.ones(2, 4, dtype=torch.int32), torch.ones(2), torch.ones(4)\n"
        "kernels.call('int8_dequant_rows', acc, s, ws, None, 2, 4)\n"
        "assert acc.view(torch.float32).eq(1).all()\n"
        "print('checked call ok', flush=True)\n"
        "small = torch.ones(4, dtype=torch.int32)\n"
        "kernels.library().int8_dequant_rows(small.data_ptr(), s.data_ptr(), ws.data_ptr(), None, 2, 4)\n"
        "print('not stopped', flush=True)\n")
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert "checked call ok" in res.stdout, res.stderr[-3000:]
    assert res.returncode != 0 and "not stopped" not in res.stdout
    assert "AddressSanitizer: heap-buffer-overflow" in res.stderr and "int8_dequant_rows" in res.stderr


def test_int8_linear_checks_its_buffers_once_when_built():
    q8 = torch.zeros(16, 8, dtype=torch.int8)
    with pytest.raises(ValueError, match=r"Int8Linear: weight_scale must hold 8 floats, got torch.float32 \(7,\)"):
        Int8Linear(q8, torch.ones(7), None, None)
    with pytest.raises(ValueError, match=r"Int8Linear: factors must hold 16 floats"):
        Int8Linear(q8, torch.ones(8), torch.zeros(8), torch.ones(8))
    with pytest.raises(ValueError, match=r"weight_q must be a 2-D int8"):
        Int8Linear(q8.float(), torch.ones(8), None, None)
