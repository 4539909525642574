"""Which precision is fast on this CPU. bf16 matmuls run natively only with AVX512-BF16 or AMX-BF16; on an
AVX2-only CPU PyTorch emulates them, roughly 10x slower than fp32 (0.6 vs 5.9 GFLOP/s on one core), and
asking for bf16 there prints one line saying so. Native is not always faster: a bf16 matmul ran ~2.4x fp32's
speed on the AVX512-BF16 CPU this was first measured on (and AMX Xeons train faster in bf16), but 0.6-1.0x on
an AVX512-BF16 Xeon with no AMX (its bf16 dot product does as many flops a cycle as fp32's two FMA ports),
and autocast's casts came on top: fine-tuning MiniLM on MRPC took 1.9x fp32's CPU time in bf16 there. So
`train.precision=auto` picks bf16 with AMX-BF16, and with AVX512-BF16 alone only where a short matmul probe
finds bf16 at least `BF16_FASTER` times fp32's speed (`bf16_matmul_speedup`, once per CPU, kept on disk).
Also this machine's other facts and settings: its CPU key for cached builds, the cache directory, and glibc
malloc's mmap threshold for CPU training (`tune_malloc`)."""
from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import platform
import sys
from pathlib import Path

NATIVE_BF16 = ("avx512_bf16", "amx_bf16")
# bf16 training pays casts (the MiniLM step: 1.4x slower where the matmuls ran at 1.0x), so its matmuls must
# be well ahead: 1.5 lies between the Xeon without AMX (1.0) and the CPUs where bf16 trained faster (~2.4)
BF16_FASTER = 1.5


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo; empty where unknown)."""
    return set(_read_flags())


@functools.lru_cache(maxsize=1)
def _flags_line() -> str:
    """/proc/cpuinfo's first feature line ("flags" on x86, "Features" on ARM), read once: layers ask at every
    forward which product runs here, and the CPU does not change."""
    try:
        with open("/proc/cpuinfo") as f:
            # (the line as read, newline included: cpu_key keys on-disk caches, which must keep their names)
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""


@functools.lru_cache(maxsize=1)
def _read_flags() -> frozenset[str]:
    line = _flags_line()
    return frozenset(line.split(":", 1)[1].split()) if line.startswith("flags") and ":" in line else frozenset()


def cpu_key() -> str:
    """What code built with -march=native (or inductor's ISA pick) is valid for: the machine and the CPU's
    flags. Cached builds are keyed on it, so a cache copied to another CPU model is rebuilt, not run."""
    return platform.machine() + _flags_line()


def cache_root() -> Path:
    """Where attnlab keeps what it builds once per machine: $ATTNLAB_CACHE, else ~/.cache/attnlab."""
    return Path(os.environ.get("ATTNLAB_CACHE") or Path.home() / ".cache" / "attnlab")


def bf16_is_native(device: str = "cpu") -> bool:
    """True where a bf16 matmul is a hardware instruction: CUDA, or a CPU with AVX512-BF16 / AMX-BF16.
    An unknown CPU (no flags to read, e.g. not Linux) counts as native: no warning we cannot back up."""
    if str(device).startswith("cuda"):
        return True
    flags = cpu_flags()
    return not flags or any(f in flags for f in NATIVE_BF16)


def bf16_warning(device: str = "cpu") -> str | None:
    """One line for a user who asked for bf16 on a CPU that emulates it, else None."""
    if bf16_is_native(device):
        return None
    return ("warning: this CPU has no AVX512-BF16 or AMX-BF16, so bf16 is emulated and slower than fp32 "
            "(about 10x for matmuls); fp32 is the fast choice here")


def resolve_precision(precision: str, device: str = "cpu") -> str:
    """train.precision "auto": "bf16" where bf16 is known to train faster (CUDA with bf16 support, a CPU with
    AMX-BF16, or AVX512-BF16 whose matmuls the probe finds fast enough: see above), else "fp32". An unknown CPU
    gets fp32: auto takes no chances. "fp32" and "bf16" are returned as given."""
    if precision != "auto":
        return precision
    if str(device).startswith("cuda"):
        import torch
        return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "fp32"
    flags = cpu_flags()
    if "amx_bf16" in flags:
        return "bf16"
    return "bf16" if bf16_needs_probe(flags) and bf16_matmul_speedup() >= BF16_FASTER else "fp32"


def bf16_needs_probe(flags: set[str]) -> bool:
    """Whether auto asks the probe on a CPU with these flags: native bf16 without AMX (elsewhere the flags
    decide)."""
    return "avx512_bf16" in flags and "amx_bf16" not in flags


@functools.lru_cache(maxsize=1)
def bf16_matmul_speedup() -> float:
    """fp32's time over bf16's for a training-sized matmul on this CPU (MiniLM's FFN on 512 tokens), the best
    of five interleaved rounds; measured once per CPU (about half a second) and kept in
    `cache_root()/bf16-speed.json` under `cpu_key()`, so a cache copied to another CPU measures again."""
    import hashlib
    import json
    import time

    import torch

    from ..atomic import atomic_write_json
    path = cache_root() / "bf16-speed.json"
    key = hashlib.sha256(cpu_key().encode()).hexdigest()[:16]
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if isinstance(known, dict) and isinstance(known.get(key), (int, float)):
        return float(known[key])
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(512, 384, generator=gen), torch.randn(384, 1536, generator=gen)
    pairs = {torch.float32: (a, b), torch.bfloat16: (a.bfloat16(), b.bfloat16())}
    best = {dtype: float("inf") for dtype in pairs}
    for _ in range(5):
        for dtype, (x, y) in pairs.items():
            x @ y  # warm: the first call of a shape pays oneDNN's setup
            start = time.perf_counter()
            for _ in range(4):
                x @ y
            best[dtype] = min(best[dtype], time.perf_counter() - start)
    speedup = round(best[torch.float32] / best[torch.bfloat16], 3)
    with contextlib.suppress(OSError):  # a read-only or full cache: measure again next time
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, {**(known if isinstance(known, dict) else {}), key: speedup})  # whole, or nothing
    return speedup


def autocast(precision: str, device_type: str = "cpu"):
    """The context training steps run their forward passes in: bf16 autocast (weights stay fp32) where
    `precision` resolves to bf16 on `device_type`, else nothing."""
    import torch
    if resolve_precision(precision, device_type) == "bf16":
        return torch.autocast(device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


_MALLOC_TUNED: bool | None = None


def tune_malloc(threshold: int = 64 << 20) -> bool:
    """Make glibc's malloc serve blocks below `threshold` bytes from its heap instead of fresh mmap'd pages,
    and keep up to 4x that freed before trimming. By default glibc maps every block of 128 kB or more anew and
    unmaps it when freed, so each training step pays page faults and zeroing for its activations and
    gradients; its threshold only rises after some larger block happens to be freed. The character recipe
    ran at ~16.5k tokens/s until an evaluation did that (step ~1,300), then ~19k; set here, 18.9k from the
    start (one thread, AVX512-BF16). Once per process, Linux with glibc only; MALLOC_MMAP_THRESHOLD_ set by
    the user or ATTNLAB_MALLOC=0 leaves malloc alone. Returns whether the setting is in force."""
    global _MALLOC_TUNED
    if _MALLOC_TUNED is None:
        _MALLOC_TUNED = False
        if (sys.platform.startswith("linux") and "MALLOC_MMAP_THRESHOLD_" not in os.environ
                and os.environ.get("ATTNLAB_MALLOC") != "0"):
            try:
                libc = ctypes.CDLL("libc.so.6")
                m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's malloc.h
                _MALLOC_TUNED = (libc.mallopt(m_mmap_threshold, threshold) == 1
                                 and libc.mallopt(m_trim_threshold, 4 * threshold) == 1)
            except (OSError, AttributeError):  # not glibc (musl, ...): nothing to tune
                pass
    return _MALLOC_TUNED
