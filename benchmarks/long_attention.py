"""Time and peak memory of one attention layer vs sequence length: where O(T^2) meets O(T).

    OMP_NUM_THREADS=1 nice -n 5 python benchmarks/long_attention.py --out research/long_attention

Methods (one (B, H, T, d) attention call each, causal, fp32):
  sdpa            F.scaled_dot_product_attention(is_causal=True), attnlab's default backend
  explicit        softmax(QK^T / sqrt(d)) V with the T x T matrix (attn_implementation=eager)
  tiled           FlashAttention's algorithm in PyTorch (attn_implementation=tiled, nn/flash.py)
  sdpa-window     SDPA with a dense causal sliding-window mask (window W): O(T^2) mask and work
  tiled-window    the tiled path on the same mask: tiles outside the band are skipped, O(T W)
  longformer      bidirectional window W + 16 global tokens (tiled), plus the global rows over all keys
  linear          linear attention (attention_kind=linear, nn/linear_attention.py), chunked causal form
  bigbird         BigBird's block-sparse attention, bidirectional (attention_kind=block_sparse,
                  nn/block_sparse.py): blocks of 64, window 3 blocks, first/last block global, 3 random
                  blocks per query block (BigBird-base), drawn in the call as in training; at most
                  (5 + 2 * 3) blocks (T <= 704) it is full attention, as in the model
For each length: forward (no grad) and forward+backward (gradients of q, k, v): seconds and peak RSS
above the inputs (VmHWM reset through /proc/self/clear_refs; glibc's mmap threshold pinned so freed
blocks go back to the system). A method is skipped at a length where its previous peak, extrapolated
quadratically, would pass --max-gb. Writes results.json, RESULTS-table.md and a log-log PNG. Run
it twice: once as above (memory, with the mmap threshold pinned), then with --timing-only (seconds with
the allocator's defaults, merged into results.json).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from pathlib import Path

# Memory is measured with glibc's mmap threshold pinned low (freed blocks go back to the system, so RSS
# shows each call's own peak); that makes every tile an mmap + page faults (3x slower tiled/linear
# attention), so seconds come from a second run with --timing-only and the allocator's defaults.
if os.environ.get("MALLOC_MMAP_THRESHOLD_") is None and "--timing-only" not in sys.argv:  # re-exec once
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from attnlab.nn.attention import AttentionMask, scaled_dot_product_attention  # noqa: E402
from attnlab.nn.block_sparse import block_sparse_attention, draw_random_blocks, uses_blocks  # noqa: E402
from attnlab.nn.linear_attention import linear_attention  # noqa: E402

_LIBC = ctypes.CDLL("libc.so.6")
METHODS = ("sdpa", "explicit", "tiled", "sdpa-window", "tiled-window", "longformer", "linear", "bigbird")
GLOBALS = 16  # Longformer global tokens (e.g. a question's tokens) for the `longformer` method
BLOCK, RANDOM = 64, 3  # BigBird-base's block size and random blocks (Zaheer et al. 2020, App. E)


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def measure(fn) -> tuple[float, int, float]:
    """(seconds, peak bytes above the RSS before the call, CPU seconds of this process: on a loaded
    machine the wall seconds include waiting for a core, the CPU seconds do not)."""
    _LIBC.malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    base = _status("VmRSS")
    start, cpu = time.perf_counter(), time.process_time()
    fn()
    seconds = time.perf_counter() - start
    return seconds, max(_status("VmHWM") - base, 0), time.process_time() - cpu


def attention_fn(method: str, q, k, v, window: int):
    t = q.size(2)
    if method == "sdpa":
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if method == "explicit":
        return lambda: scaled_dot_product_attention(q, k, v, AttentionMask(None, True), explicit=True)[0]
    if method == "tiled":
        return lambda: scaled_dot_product_attention(q, k, v, AttentionMask(None, True), tiled=True)[0]
    if method == "sdpa-window":
        # the dense mask is part of the method's cost: built inside the call
        return lambda: scaled_dot_product_attention(
            q, k, v, AttentionMask.build(None, t, t, causal=True, window=window, device=q.device))[0]
    if method == "tiled-window":
        return lambda: scaled_dot_product_attention(
            q, k, v, AttentionMask.build(None, t, t, causal=True, window=window, device=q.device), tiled=True)[0]
    if method == "longformer":
        # Longformer's pattern (Beltagy et al. 2020): the window plus GLOBALS tokens every token sees and that see
        # every token (tiled: their rows/columns are never skipped), then the global rows' own attention over
        # all T keys (O(GLOBALS T); the model uses separate projections for it, same cost)
        glob = torch.zeros(q.size(0), t, dtype=torch.bool)
        glob[:, torch.linspace(0, t - 1, GLOBALS).long()] = True

        def run():
            mask = AttentionMask.build(None, t, t, window=window, global_tokens=glob, device=q.device)
            local = scaled_dot_product_attention(q, k, v, mask, tiled=True)[0]
            rows = scaled_dot_product_attention(q[:, :, glob[0]], k, v)[0]
            return local.index_copy(2, glob[0].nonzero()[:, 0], rows)
        return run
    if method == "linear":
        return lambda: linear_attention(q, k, v, causal=True)[0]
    if method == "bigbird":
        if not uses_blocks(t, BLOCK, RANDOM):  # too few blocks: the model attends fully, as transformers does
            return lambda: F.scaled_dot_product_attention(q, k, v)
        return lambda: block_sparse_attention(q, k, v, None, BLOCK, RANDOM,
                                              draw_random_blocks(t // BLOCK, RANDOM, q.size(1)))
    raise ValueError(f"unknown method {method!r}; methods: {', '.join(METHODS)}")


def run_one(method: str, t: int, backward: bool, args) -> tuple[float, int, float]:
    g = torch.Generator().manual_seed(t)
    q, k, v = (torch.randn(args.batch, args.heads, t, args.dim, generator=g).requires_grad_(backward)
               for _ in range(3))
    fn = attention_fn(method, q, k, v, args.window)
    if backward:
        grad = torch.randn(args.batch, args.heads, t, args.dim, generator=g)

        def step():
            torch.autograd.grad(fn(), (q, k, v), grad)
    else:
        def step():
            with torch.no_grad():
                fn()
    repeats = args.repeats if t <= 2048 else 1
    runs = [measure(step) for _ in range(repeats)]
    return min(r[0] for r in runs), max(r[1] for r in runs), min(r[2] for r in runs)


def plot(results: list[dict], path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")  # files only
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 2, figsize=(11, 8.5))
    for col, mode in enumerate(("forward", "forward+backward")):
        for row, (key, label) in enumerate((("seconds", "seconds"), ("peak_mb", "peak memory above inputs (MB)"))):
            ax = axes[row][col]
            for method in METHODS:
                pts = [(r["T"], r[key]) for r in results if r["method"] == method and r["mode"] == mode
                       and r.get(key) is not None]
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=method)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length T")
            ax.set_ylabel(label)
            ax.set_title(mode)
            ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(results: list[dict], lengths: list[int]) -> str:
    lines = []
    for mode in ("forward", "forward+backward"):
        lines += [f"**{mode}**: wall seconds (CPU seconds where recorded) / peak MB above the inputs (`-` = skipped: "
                  "would pass the memory cap)", "",
                  "| method | " + " | ".join(f"T={t}" for t in lengths) + " |",
                  "|---|" + "---|" * len(lengths)]
        for method in [m for m in METHODS if any(r["method"] == m for r in results)]:
            cells = []
            for t in lengths:
                r = next((r for r in results if r["method"] == method and r["mode"] == mode and r["T"] == t), None)
                cpu = f" (CPU {r['cpu_seconds']:.3g} s)" if r is not None and r.get("cpu_seconds") is not None else ""
                cells.append("-" if r is None or r["seconds"] is None else
                             f"{r['seconds']:.3g} s{cpu} / {r['peak_mb']:.0f} MB")
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def timing_only(args, methods, lengths, out: Path) -> None:
    suffix = "" if (args.heads, args.dim) == (4, 64) else f"-h{args.heads}-d{args.dim}"
    path = out / f"results{suffix}.json"
    data = json.loads(path.read_text())
    load_start = os.getloadavg()
    for r in data["results"]:
        if r["method"] in methods and r["T"] in lengths and r["mode"] in args.modes.split(",") and r["seconds"] is not None:
            r["seconds"], _, r["cpu_seconds"] = run_one(r["method"], r["T"], r["mode"] != "forward", args)
            r["load_timing"] = os.getloadavg()[0]
            print(json.dumps(r), flush=True)
    data["meta"]["timing"] = dict(load_start=load_start, load_end=os.getloadavg(), methods=methods,
                                  malloc="glibc defaults")
    path.write_text(json.dumps(data, indent=1) + "\n")
    all_lengths = sorted({r["T"] for r in data["results"]})
    (out / f"RESULTS-table{suffix}.md").write_text(markdown(data["results"], all_lengths))
    meta = data["meta"]
    plot(data["results"], out / f"long_attention{suffix}.png",
         f"one causal attention call, B={args.batch} H={args.heads} d={args.dim} fp32, window {args.window}; "
         f"1 thread, load {meta['load_start'][0]:.1f}-{os.getloadavg()[0]:.1f} on 2 cores")
    print(markdown(data["results"], all_lengths))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lengths", default="512,1024,2048,4096,8192,16384")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--repeats", type=int, default=2, help="best of this many runs up to T=2048, one run above")
    p.add_argument("--max-gb", type=float, default=8.0)
    p.add_argument("--modes", default="forward,forward+backward")
    p.add_argument("--out", default="research/long_attention")
    p.add_argument("--timing-only", action="store_true",
                   help="seconds only, default allocator; replaces the seconds of an existing results file")
    p.add_argument("--merge", action="store_true", help="replace only these methods' rows in an existing results file")
    args = p.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    methods = args.methods.split(",")
    for m in methods:
        if m not in METHODS:
            raise SystemExit(f"--methods: unknown method {m!r}; methods: {', '.join(METHODS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    load_start = os.getloadavg()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, B={args.batch} H={args.heads} "
          f"d={args.dim} window={args.window}, load {load_start}", flush=True)
    for method in methods:  # warm-up: first calls pay for lazy initialisation (autograd, kernels)
        warm = 1024 if method == "bigbird" else 256  # bigbird: long enough for its blocks
        run_one(method, warm, True, argparse.Namespace(**{**vars(args), "repeats": 1}))
    if args.timing_only:
        return timing_only(args, methods, lengths, out)
    results = []
    for mode in args.modes.split(","):
        for method in methods:
            last = None  # (T, peak bytes) of the previous length
            for t in lengths:
                row = dict(method=method, mode=mode, T=t, seconds=None, peak_mb=None)
                if last is not None and last[1] * (t / last[0]) ** 2 > args.max_gb * 2**30 and method not in ("linear", "tiled-window", "longformer", "bigbird"):
                    row["skipped"] = f"extrapolated peak > {args.max_gb} GB"
                else:
                    seconds, peak, cpu = run_one(method, t, mode != "forward", args)
                    row.update(seconds=seconds, peak_mb=peak / 2**20, cpu_seconds=cpu, load=os.getloadavg()[0])
                    last = (t, peak)
                results.append(row)
                print(json.dumps(row), flush=True)
    suffix = "" if (args.heads, args.dim) == (4, 64) else f"-h{args.heads}-d{args.dim}"
    reruns = []
    if args.merge and (out / f"results{suffix}.json").exists():
        old = json.loads((out / f"results{suffix}.json").read_text())
        ran = {(r["method"], r["mode"]) for r in results}
        results = [r for r in old["results"] if (r["method"], r["mode"]) not in ran] + results
        results.sort(key=lambda r: (r["mode"] != "forward", METHODS.index(r["method"]), r["T"]))
        reruns = old["meta"].get("reruns", []) + [dict(methods=methods, load_start=load_start)]
        load_start = old["meta"]["load_start"]
        methods = [m for m in METHODS if any(r["method"] == m for r in results)]
    meta = dict(batch=args.batch, heads=args.heads, dim=args.dim, window=args.window, torch=torch.__version__,
                threads=torch.get_num_threads(), load_start=load_start, load_end=os.getloadavg(),
                omp_num_threads=os.environ.get("OMP_NUM_THREADS"), reruns=reruns)
    (out / f"results{suffix}.json").write_text(json.dumps(dict(meta=meta, results=results), indent=1) + "\n")
    (out / f"RESULTS-table{suffix}.md").write_text(markdown(results, lengths))
    title = (f"one causal attention call, B={args.batch} H={args.heads} d={args.dim} fp32, window {args.window}; "
             f"1 thread, load {load_start[0]:.1f}-{meta['load_end'][0]:.1f} on 2 cores")
    plot(results, out / f"long_attention{suffix}.png", title)
    print(markdown(results, lengths))
    print(f"wrote {out}/results{suffix}.json, RESULTS-table{suffix}.md, long_attention{suffix}.png; load {meta['load_end']}")


if __name__ == "__main__":
    main()
