"""Shared bits of the side-by-side benchmarks: where data and packaged models are, timing."""
from __future__ import annotations

import os
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def data_root() -> Path:
    root = Path(os.environ.get("ATTNLAB_DATA", REPO.parent / "shared" / "data"))
    if not root.is_dir():
        raise SystemExit(f"real data not found at {root}; set ATTNLAB_DATA")
    return root


def llama_no_repack() -> bool:
    """llama.cpp's tools crash (SIGSEGV) with their default repacked weights on CPUs with AMX: there the
    benchmarks run them with repacking off (`--no-repack`; llama-bench `--repack 0`), the best that runs."""
    cpuinfo = Path("/proc/cpuinfo")
    return cpuinfo.exists() and "amx_int8" in cpuinfo.read_text()


def best_of(fn, repeats: int = 3) -> float:
    """Fastest of a few runs: the least disturbed by whatever else the machine is doing."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def best_of_interleaved(fns: dict, repeats: int = 5) -> dict:
    """Fastest run of each function, taking turns (a, b, b, a, ...) so that a slow spell of the machine
    hits every side rather than whichever happened to run during it."""
    best = {name: float("inf") for name in fns}
    for i in range(repeats):
        for name in (list(fns) if i % 2 == 0 else list(fns)[::-1]):
            start = time.perf_counter()
            fns[name]()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def table(rows: list[list], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).rjust(w) for c, w in zip(r, widths))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])
