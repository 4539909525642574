"""Building and loading attnlab's C kernels (`csrc/*.c`), with no torch import: the library the door of
`kernels.py` checks every call into, and that inference/lean.py decodes on before torch is loaded.

Build: the sources are compiled once per machine into one shared library under `cache_root()/kernels`,
keyed by the sources, the compiler (path and `--version`), the flags and the CPU's flags, so a compiler
upgrade, another flag set or a cache copied to another CPU builds anew instead of running stale code. With
the CPU's flags known (Linux /proc/cpuinfo) the build is `-O3 -march=native`; without them it is portable
(`-O3` for the architecture's baseline): -march=native code keyed by an architecture name alone could
run on a CPU that lacks its instructions. ATTNLAB_KERNEL_SANITIZE=1 builds with AddressSanitizer and
UBSan (a separate cache entry; python must run with the ASan runtime preloaded, see the Makefile's
`sanitize` target).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from . import precision

_CSRC = Path(__file__).with_name("csrc")
SOURCES = sorted(_CSRC.glob("*.c"))  # every kernel, their worker threads (thread_pool.c), the decode steps
SANITIZE_FLAGS = ["-O1", "-g", "-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
_lock = threading.Lock()
_state: dict = {}  # "lib": CDLL or None, "error": why the library is not there, "plan": the build


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
    # The two functions called with bound values (`call_bound`): the decode steps take a table of every layer's
    # weight and cache pointers, which inference/block_step.py (or inference/lean.py) builds and checks. The
    # checked door (kernels.py) declares the types of all the others from their signatures.
    p, i32, i64, f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
    lib.llama_decode_step.argtypes = [i32, p, p, p, i32, i32, i32, i32, i32, f32, f32, i64, i64, p, p, p, i32, p]
    lib.llama_decode_step.restype = i32
    lib.paged_decode_layers.argtypes = [i32, i64, p, p, p, i32, i32, i32, i32, i32, f32, f32, i64, i64, p, p, p,
                                        p, p, p, i64, i32, p, i32]
    lib.paged_decode_layers.restype = i32
    return lib


def load() -> ctypes.CDLL | None:
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
    load()
    return _state.get("error")


def build_plan_used() -> dict | None:
    """The plan the loaded library was built from (None before `load` or when it failed)."""
    return _state.get("plan")


def reset() -> None:
    """Forget the library and why it is missing: the next `load` decides anew (for tests)."""
    with _lock:
        _state.clear()


def call_bound(fn: str, *values) -> None:
    """C function `fn` on ctypes values its caller bound and checked once (a table of pointers to every
    layer's weights, as inference/block_step.py binds for `llama_decode_step`): this still owns the library
    and the status check, so no call reaches C around it."""
    lib = load()
    if lib is None:
        raise RuntimeError(f"C kernel function {fn}: the kernel library is unavailable ({_state.get('error')})")
    rc = getattr(lib, fn)(*values)
    if rc:
        raise RuntimeError(f"C kernel function {fn} failed with status {rc}")


def step_scratch_floats(cfg, scores: int = 0) -> int:
    """Floats of scratch memory a row of the C decoding steps uses (`paged_decode_layers` in csrc/paged_step.c,
    per row; `llama_decode_step` in csrc/ggml_blocks.c with `scores` = its cache capacity, one score a cached
    position): the normed input and attention output, q and its output, k, v and the FFN's two halves."""
    return (2 * cfg.hidden_size + 2 * (cfg.num_heads + cfg.kv_heads) * cfg.dim_head + 2 * cfg.intermediate_size
            + scores)
