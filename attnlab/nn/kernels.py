"""The one door to attnlab's C kernels (`csrc/*.c`): built on first use, called through ctypes, checked.

Build: the sources are compiled once per machine into one shared library under `cache_root()/kernels`,
keyed by the sources, the compiler (path and `--version`), the flags and the CPU's flags, so a compiler
upgrade, another flag set or a cache copied to another CPU builds anew instead of running stale code. With
the CPU's flags known (Linux /proc/cpuinfo) the build is `-O3 -march=native`; without them it is portable
(`-O3` for the architecture's baseline): -march=native code keyed by an architecture name alone could
run on a CPU that lacks its instructions. ATTNLAB_KERNEL_SANITIZE=1 builds with AddressSanitizer and
UBSan (a separate cache entry; python must run with the ASan runtime preloaded, see the Makefile's
`sanitize` target).

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
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from . import precision
from .kernel_signatures import KERNELS, SIGNATURES, KernelArgumentError, check_args, ctypes_args

__all__ = ["KERNELS", "KernelArgumentError", "active", "call", "kernel_status", "library", "split_rows"]

_CSRC = Path(__file__).with_name("csrc")
# + the kernels' worker threads, and the engine's batched decode step (over ggml_blocks and paged_attention)
SOURCES = [_CSRC / f"{name}.c" for name in KERNELS] + [_CSRC / "thread_pool.c", _CSRC / "paged_step.c"]
SANITIZE_FLAGS = ["-O1", "-g", "-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
_log = logging.getLogger("attnlab.kernels")
_lock = threading.Lock()
_state: dict = {}          # "lib": CDLL or None, "error": why the library is not there, "plan": the build
_warned: set[str] = set()  # kernels whose fallback line was written in this process
_pool: ThreadPoolExecutor | None = None


def cpu_flags() -> set[str]:
    """The CPU's feature flags, empty where unknown (tests replace this to fake another CPU)."""
    return precision.cpu_flags()


def find_compiler() -> tuple[str | None, str]:
    """(path of the C compiler, "") or (None, why there is none): $CC if set (it must exist), else cc, gcc,
    clang on PATH."""
    cc = os.environ.get("CC")
    if cc:
        found = shutil.which(cc)
        return (found, "") if found else (None, f"CC={cc} is not an executable program")
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return found, ""
    return None, "no C compiler found (cc, gcc or clang on PATH, or CC)"


def _compiler_version(cc: str) -> str:
    try:
        res = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as err:
        raise OSError(f"{cc} --version failed: {err}") from err
    lines = res.stdout.strip().splitlines()
    if res.returncode or not lines:
        raise OSError(f"{cc} --version failed: {res.stderr.strip()[-200:]}")
    return lines[0]


def build_plan() -> dict:
    """What the library is built from and where it goes: cc, version, flags, key, out. OSError when there is
    no usable compiler."""
    cc, why = find_compiler()
    if cc is None:
        raise OSError(why)
    version = _compiler_version(cc)
    flags_known = sorted(cpu_flags())
    flags = ["-O3", "-march=native"] if flags_known else ["-O3"]
    if os.environ.get("ATTNLAB_KERNEL_SANITIZE") == "1":
        flags = [f for f in flags if f != "-O3"] + SANITIZE_FLAGS
    flags += ["-shared", "-fPIC", "-pthread"]
    digest = hashlib.sha256()
    for path in [*SOURCES, *sorted(_CSRC.glob("*.h"))]:  # headers are included by the sources
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    for part in (cc, version, " ".join(flags), platform.machine(), " ".join(flags_known)):
        digest.update(b"\0" + part.encode())
    key = digest.hexdigest()[:16]
    out = precision.cache_root() / "kernels" / f"attnlab-kernels-{key}.so"
    return {"cc": cc, "version": version, "flags": flags, "key": key, "out": out}


def _build(plan: dict) -> ctypes.CDLL:
    out = plan["out"]
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:  # build aside, rename: safe for parallel runs
            tmp_so = Path(tmp) / out.name
            cmd = [plan["cc"], *plan["flags"], "-o", str(tmp_so), *map(str, SOURCES), "-lm"]
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode:
                raise OSError(f"{' '.join(cmd)} failed: {res.stderr.strip()[-400:]}")
            os.replace(tmp_so, out)
    lib = ctypes.CDLL(str(out))
    for fn, sig in SIGNATURES.items():
        func = getattr(lib, fn)
        func.argtypes = ctypes_args(sig)
        func.restype = ctypes.c_int
        if "parallel" in sig:
            par = getattr(lib, sig["parallel"])
            par.argtypes = ctypes_args(sig) + [ctypes.c_int]  # (..., start, end, threads)
            par.restype = ctypes.c_int
    # The two functions called with bound values (`call_bound`): the decode steps take a table of every layer's
    # weight and cache pointers, which inference/block_step.py builds from the modules and checks. Their
    # types are still declared here, with the others.
    p, i32, i64, f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
    lib.llama_decode_step.argtypes = [i32, p, p, p, i32, i32, i32, i32, i32, f32, f32, i64, i64, p, p, p]
    lib.llama_decode_step.restype = i32
    lib.paged_decode_layers.argtypes = [i32, i64, p, p, p, i32, i32, i32, i32, i32, f32, f32, i64, i64, p, p, p,
                                        p, p, p, i64, i32, p, i32]
    lib.paged_decode_layers.restype = i32
    return lib


def library() -> ctypes.CDLL | None:
    """The compiled library (built on first use), or None when it cannot be built (`why_unavailable`)."""
    if "lib" not in _state:
        with _lock:
            if "lib" not in _state:
                try:
                    plan = build_plan()
                    _state["plan"] = plan
                    _state["lib"] = _build(plan)
                except OSError as err:
                    _state["error"] = str(err)
                    _state["lib"] = None
    return _state["lib"]


def why_unavailable() -> str | None:
    library()
    return _state.get("error")


def reset() -> None:
    """Forget the library, the status and the lines written: the next use decides anew (for tests)."""
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
        reason = _state["error"]
    else:
        flags = cpu_flags()
        arch_ok = platform.machine().lower() in ("x86_64", "amd64")
        missing = [f for f in kernel["needs"] if arch_ok and flags and f not in flags]
        if kernel["needs"] and not arch_ok:
            reason = f"needs {', '.join(kernel['needs'])} (x86-64), this CPU is {platform.machine()}"
        elif missing:
            reason = f"this CPU lacks {', '.join(missing)}"
        elif kernel["probe"] and not getattr(lib, kernel["probe"])():
            reason = f"built without {', '.join(kernel['needs'])} (the compiler or the CPU does not offer it)"
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
            plan = _state["plan"]
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
        raise RuntimeError(f"C kernel function {fn}: the kernel library is unavailable ({_state.get('error')})")
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


def call_bound(fn: str, *values) -> None:
    """C function `fn` on ctypes values its caller bound and checked once (a table of pointers to every
    layer's weights, as inference/block_step.py binds for `llama_decode_step`): the door still owns the
    library and the status check, so no call reaches C around it."""
    lib = library()
    if lib is None:
        raise RuntimeError(f"C kernel function {fn}: the kernel library is unavailable ({_state.get('error')})")
    rc = getattr(lib, fn)(*values)
    if rc:
        raise RuntimeError(f"C kernel function {fn} failed with status {rc}")
