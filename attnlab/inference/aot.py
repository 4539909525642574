"""The compiled decode step, kept on disk: one AOTInductor package per (weights, batch size), so that a
second process loads it in seconds instead of compiling for minutes.

Why not inductor's own caches: freezing packs the weights into mkldnn tensors, which torch 2.13's FX
graph cache cannot pickle ("mkldnn tensors unpickleable"), so the JIT path compiled again in every new
process (about 110 s here, 70 s with the generated C++ reused). Turning the packing off made the cache hit
but took away the speed. `torch.export` + `aoti_compile_and_package` instead writes one shared library
with the packed weights inside; loading it is a dlopen and a read of the weights.

The number of key/value columns (the capacity) is a dynamic dimension, so one package serves every
prompt length; the batch size stays static (inductor's CPU GEMM templates are built for a fixed M).
The key hashes everything that changes the code or its constants: the weights' bytes, the config, the
source files the step is traced from, torch's version and the CPU's flags (the code is built for this
ISA). A package is written under a temporary name and renamed, so a killed compile leaves nothing
half-written, and two processes compiling the same step both end with a whole file.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn

from ..nn.precision import cache_root, cpu_key

_PACKAGE = Path(__file__).resolve().parents[1]
# the code a step is traced from: a change here must not load a package built from the old code
_TRACED_SOURCES = ("nn", "models", "config.py", "inference/compiled.py", "inference/aot.py",
                   "inference/kv_cache.py")

# what this process did, for tests and benchmarks: packages compiled, packages loaded from disk
counts = {"built": 0, "loaded": 0}
# Packages are ~2x the weights (1.1 GB for SmolLM2-135M in fp32): past this total the least recently used
# ones are deleted after a new one is written ($ATTNLAB_COMPILED_MAX_GB, default 8).
DEFAULT_MAX_GB = 8.0


def cache_dir() -> Path:
    """$ATTNLAB_CACHE/compiled (default ~/.cache/attnlab/compiled)."""
    return cache_root() / "compiled"


def _source_digest() -> str:
    h = hashlib.sha256()
    for name in _TRACED_SOURCES:
        path = _PACKAGE / name
        for f in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            h.update(f.relative_to(_PACKAGE).as_posix().encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def weights_digest(model: nn.Module) -> str:
    """sha256 over every parameter and buffer (name, dtype, shape, bytes): ~1 s for 540 MB of fp32."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().data)
    return h.hexdigest()


def package_key(model: nn.Module, batch: int, options: dict, weights: str | None = None) -> str:
    """weights: the model's `weights_digest`, when the caller already has it (hashing reads every weight)."""
    config = model.config.to_dict() if hasattr(model.config, "to_dict") else repr(model.config)
    meta = json.dumps({"torch": torch.__version__, "batch": batch, "options": options, "config": config,
                       "device": str(next(model.parameters()).device), "cpu": cpu_key(),
                       "source": _source_digest()}, sort_keys=True, default=str)
    return hashlib.sha256((meta + (weights or weights_digest(model))).encode()).hexdigest()[:24]


class _Step(nn.Module):
    """The step function as a module over the model, for torch.export."""

    def __init__(self, fn, model: nn.Module) -> None:
        super().__init__()
        self.fn, self.model = fn, model

    def forward(self, token, position, allowed, col, keys, values):
        return self.fn(self.model, token, position, allowed, col, keys, values)


def load_or_build(fn, model: nn.Module, args: tuple, inductor_options: dict, *, directory: Path | None = None,
                  weights: str | None = None):
    """The AOTInductor runner of `fn(model, token, position, allowed, col, keys, values)` for these
    arguments' batch size: loaded from `directory` (default `cache_dir()`) when a package with this key
    exists, else exported, compiled (minutes, once) and saved there. Returns (runner, path)."""
    token = args[0]
    directory = Path(directory) if directory is not None else cache_dir()
    path = directory / f"step-{package_key(model, token.size(0), inductor_options, weights)}.pt2"
    built = not path.exists()
    if built:
        _build(fn, model, args, inductor_options, path)
        evict(directory, keep=path)
    os.utime(path)  # "recently used", for evict()
    t = time.perf_counter()
    try:
        runner = torch._inductor.aoti_load_package(str(path))
    except Exception as e:  # a damaged file (a full disk, a copy cut short): replace it rather than trip on it
        if built:
            raise
        print(f"\nthe compiled step {path} does not load ({type(e).__name__}); compiling it again",
              file=sys.stderr, flush=True)
        path.unlink(missing_ok=True)
        return load_or_build(fn, model, args, inductor_options, directory=directory, weights=weights)
    counts["loaded"] += 1
    print(f"\ncompiled decode step loaded from {path} in {time.perf_counter() - t:.1f}s", file=sys.stderr, flush=True)
    return runner, path


def _build(fn, model, args, inductor_options, path: Path) -> None:
    import torch._inductor  # noqa: F401  (aoti_compile_and_package lives there)
    print(f"\ncompiling the decode step for batch {args[0].size(0)} (1.5-3 minutes on a CPU, once: later "
          f"processes load it from {path.parent}) ...", file=sys.stderr, flush=True)
    t = time.perf_counter()
    keys, values = args[4], args[5]
    limit = getattr(model.config, "max_position_embeddings", None) or 1 << 16
    capacity = torch.export.Dim("capacity", min=2, max=max(limit, keys[0].size(2)))
    columns = [{2: capacity}] * len(keys)
    shapes = {"token": None, "position": None, "allowed": {3: capacity}, "col": None,
              "keys": columns, "values": columns}
    # export on copies of the caches: tracing must not write into the live ones
    example = (*args[:4], [k.clone() for k in keys], [v.clone() for v in values])
    with torch.no_grad():
        program = torch.export.export(_Step(fn, model), example, dynamic_shapes=shapes, strict=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.pt2")
    try:
        torch._inductor.aoti_compile_and_package(program, package_path=str(tmp), inductor_configs=inductor_options)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    counts["built"] += 1
    print(f"compiled in {time.perf_counter() - t:.0f}s: {path} ({path.stat().st_size / 1e6:.0f} MB)",
          file=sys.stderr)


def evict(directory: Path, keep: Path, max_bytes: float | None = None) -> list[Path]:
    """Delete the least recently used packages in `directory` until they total at most `max_bytes`
    (default $ATTNLAB_COMPILED_MAX_GB GB); `keep` (the one just written) stays whatever its size.
    Returns the deleted paths."""
    if max_bytes is None:
        max_bytes = float(os.environ.get("ATTNLAB_COMPILED_MAX_GB", DEFAULT_MAX_GB)) * 1e9
    packages = sorted(Path(directory).glob("step-*.pt2"), key=lambda p: p.stat().st_mtime)  # oldest first
    total = sum(p.stat().st_size for p in packages)
    gone = []
    for p in packages:
        if total <= max_bytes:
            break
        if p == keep:
            continue
        total -= p.stat().st_size
        p.unlink(missing_ok=True)
        gone.append(p)
        print(f"removed the least recently used compiled step {p.name} (the cache holds at most "
              f"{max_bytes / 1e9:g} GB: $ATTNLAB_COMPILED_MAX_GB)", file=sys.stderr)
    return gone
