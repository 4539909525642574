"""The one door to attnlab's C kernels (`csrc/*.c`): built on first use, called through ctypes, checked.

Build: `kernel_build.py` (once per machine, cached under `cache_root()/kernels`, keyed by the sources, the
compiler, the flags and the CPU; no torch there).

Fallback: without a C compiler, or on a CPU lacking a kernel's instructions, every entry point takes
its PyTorch path (same results) and one line per kernel and process says so: a warning when the library
could not be built (speed is lost that this machine could have), an info line when the CPU lacks the
kernel's instructions (the PyTorch path is then the fastest correct one here, nothing to act on).
`kernel_status()` and `attnlab env` list every kernel with whether it is active and why (or why not).

Calls: `call(fn, *args)` checks each argument against the function's declared signature
(`kernel_signatures.py`): CPU device, dtype, contiguity, shape and size, raising a ValueError that names the
function, the argument, what was expected and what came; then it calls C (splitting row ranges over
torch's thread count where the function takes them: in C, on csrc/thread_pool.c's workers, for the functions
of a serving step, whose calls are too short for a hand-off between Python threads; on Python threads for
the others) and raises if the C status is not 0. Tensors go in, pointers (and stride arrays) are derived
here, so a caller cannot hand C a size that does not match.
"""
from __future__ import annotations

import ctypes
import logging
import platform
import threading
from concurrent.futures import ThreadPoolExecutor

import torch

from . import kernel_build, precision
from .kernel_build import SOURCES, build_plan, call_bound, find_compiler  # noqa: F401  (re-exported)
from .kernel_signatures import KERNELS, SIGNATURES, KernelArgumentError, check_args, ctypes_args

__all__ = ["KERNELS", "KernelArgumentError", "active", "call", "kernel_status", "library", "split_rows"]

_log = logging.getLogger("attnlab.kernels")
_lock = threading.Lock()
_state: dict = {}          # "typed": the library whose signatures' C types are declared
_warned: set[str] = set()  # kernels whose fallback line was written in this process
_pool: ThreadPoolExecutor | None = None


def cpu_flags() -> set[str]:
    """The CPU's feature flags, empty where unknown (tests replace this to fake another CPU)."""
    return precision.cpu_flags()


def library() -> ctypes.CDLL | None:
    """The compiled library (built on first use, kernel_build.py) with every signature's C types declared,
    or None when it cannot be built (`why_unavailable`)."""
    lib = kernel_build.load()
    if lib is not None and _state.get("typed") is not lib:
        with _lock:
            for fn, sig in SIGNATURES.items():
                func = getattr(lib, fn)
                func.argtypes = ctypes_args(sig)
                func.restype = ctypes.c_int
                if "parallel" in sig:
                    par = getattr(lib, sig["parallel"])
                    par.argtypes = ctypes_args(sig) + [ctypes.c_int]  # (..., start, end, threads)
                    par.restype = ctypes.c_int
            _state["typed"] = lib
    return lib


def why_unavailable() -> str | None:
    return kernel_build.why_unavailable()


def reset() -> None:
    """Forget the library, the status and the lines written: the next use decides anew (for tests)."""
    kernel_build.reset()
    with _lock:
        _state.clear()
        _warned.clear()
        for kernel in KERNELS.values():
            kernel.pop("_reason", None)


def _reason(name: str) -> str:
    """"" when kernel `name` can run here, else why not."""
    kernel = KERNELS[name]
    if "_reason" in kernel:
        return kernel["_reason"]
    lib = library()
    if lib is None:
        reason = kernel_build.why_unavailable()
    else:
        flags = cpu_flags()
        arch_ok = platform.machine().lower() in ("x86_64", "amd64")
        missing = [f for f in kernel["needs"] if arch_ok and flags and f not in flags]
        if kernel["needs"] and not arch_ok:
            reason = f"needs {', '.join(kernel['needs'])} (x86-64), this CPU is {platform.machine()}"
        elif missing:
            reason = f"this CPU lacks {', '.join(missing)}"
        elif kernel["probe"] and not getattr(lib, kernel["probe"])():
            reason = kernel.get("probe_fails") or \
                f"built without {', '.join(kernel['needs'])} (the compiler or the CPU does not offer it)"
        else:
            reason = ""
    kernel["_reason"] = reason
    return reason


def kernel_reason(name: str) -> str:
    """"" when kernel `name` runs here, else why not (without the line `active` writes)."""
    return _reason(name)


def active(name: str) -> bool:
    """Whether kernel `name` runs here; the first time it does not, one line says so (per process)."""
    reason = KERNELS[name].get("_reason")
    if reason is None:
        reason = _reason(name)
    if reason and name not in _warned:
        _warned.add(name)
        # a CPU without the instructions is not a fault: every command on it would repeat the line
        level = logging.INFO if reason.startswith("this CPU lacks") else logging.WARNING
        _log.log(level, "attnlab: C kernel %s unavailable (%s); using the PyTorch path", name, reason)
    return not reason


def kernel_status() -> list[dict]:
    """Every C kernel: {"name", "active", "reason"} (reason: how it was built, or why it is not used)."""
    rows = []
    for name in KERNELS:
        reason = _reason(name)
        if not reason:
            plan = kernel_build.build_plan_used()
            reason = f"built with {plan['version']} ({' '.join(plan['flags'][:-3])})"
            rows.append({"name": name, "active": True, "reason": reason})
        else:
            rows.append({"name": name, "active": False, "reason": reason})
    return rows


def split_rows(fn, rows: int, min_rows: int = 1) -> None:
    """fn(start, end) over [0, rows), split across torch's intra-op thread count (at least `min_rows` each):
    a kernel call releases the GIL (ctypes), so the threads run in parallel."""
    threads = max(1, min(torch.get_num_threads(), rows // max(1, min_rows)))
    if threads == 1:
        fn(0, rows)
        return
    global _pool
    if _pool is None or _pool._max_workers < threads - 1:
        _pool = ThreadPoolExecutor(max_workers=threads - 1, thread_name_prefix="attnlab-kernels")
    cuts = [rows * i // threads for i in range(threads + 1)]
    # the calling thread takes the first part itself: one hand-off fewer per call (tens of thousands of
    # calls a minute when serving)
    others = [_pool.submit(fn, cuts[i], cuts[i + 1]) for i in range(1, threads)]
    try:
        fn(cuts[0], cuts[1])
    finally:
        for f in others:
            f.result()


def call(fn: str, *args, min_rows: int = 1) -> int:
    """C function `fn` on `args` (tensors where it takes pointers), after checking them against its
    signature; functions over a row range run split across threads. Returns the C result (0 for the
    status functions); raises KernelArgumentError (a ValueError) before C for a bad argument and
    RuntimeError when C reports a failure. The caller must have asked `active()` for the kernel."""
    sig = SIGNATURES[fn]
    values, rows = check_args(fn, sig, args)
    lib = library()
    if lib is None:
        raise RuntimeError(f"C kernel function {fn}: the kernel library is unavailable ({why_unavailable()})")
    cfunc = getattr(lib, fn)
    if rows is None:
        rc = cfunc(*values)
        if sig.get("status", True) and rc:
            raise RuntimeError(f"C kernel function {fn} failed with status {rc}")
        return rc
    if "parallel" in sig:  # split in C (csrc/thread_pool.c): no Python thread hand-off per call
        threads = max(1, min(torch.get_num_threads(), rows // max(1, min_rows)))
        rc = getattr(lib, sig["parallel"])(*values, 0, rows, threads)
        if rc:
            raise RuntimeError(f"C kernel function {fn} failed with status {rc}")
        return 0
    failed: list[int] = []
    split_rows(lambda start, end: failed.append(cfunc(*values, start, end)), rows, min_rows)
    bad = [rc for rc in failed if rc]
    if bad:
        raise RuntimeError(f"C kernel function {fn} failed with status {bad[0]}")
    return 0
