"""Where a decoding step's time goes: `attnlab generate`'s batch-1 path on a GGUF file (inference/lean.py, the C
kernels on numpy buffers, no torch), split per token into the C calls and what runs around them.

    .venv/bin/python benchmarks/decode_breakdown.py [--model smollm2] [--new-tokens 128] [--rounds 3] [--threads 1]

Every C call of the path goes through `nn.kernel_build.call_bound`; this script times each call there (the
ctypes argument conversion included) while the 128 steps after a 16-token prompt run, as
`benchmarks/gguf_decode.py` times them. Per token it prints:
  - llama_decode_step: every layer of the step (the seven weight products, RMSNorms, rotary, attention);
  - ggml_matmul_cols_par: the LM head (the vocabulary's rows against the last hidden state);
  - ggml_rows: the next token's embedding row;
  - the rest: Python and numpy around the calls (the final RMSNorm, argmax, the generator, the timer itself).
and the bytes the step reads (every layer's weights and the head, as stored or as repacked) against this
core's streaming bandwidth (numpy's sum over a 256 MB array, best of 5): the step's memory ceiling. The best
round (fewest total seconds) is reported. Not a test: numbers depend on the machine and on what else runs.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def stream_gb_s(mb: int = 256, repeats: int = 5) -> float:
    """GB/s one core reads from an array far larger than its caches (the decode step's ceiling)."""
    import numpy as np
    a = np.ones(mb * 2 ** 20 // 4, np.float32)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a.sum()
        best = min(best, time.perf_counter() - start)
    return a.nbytes / best / 1e9


def step_bytes(dec) -> int:
    """Bytes a batch-1 step reads from weights: each layer's matrices (the repacked copy where the step takes
    it), norms, and the LM head."""
    total = 0
    for i, row in enumerate(dec._weights):
        for j, w in enumerate(row):
            packed = dec._packed[7 * i + j - 2] if j >= 2 else None
            total += (packed if packed is not None else w).nbytes
    return total + dec.head.nbytes + dec.final_norm.nbytes


def measure(model: str, new_tokens: int, rounds: int) -> dict:
    import numpy as np
    sys.path.insert(0, str(REPO))
    from attnlab.inference.lean import LeanDecoder
    from attnlab.locate import resolve
    from attnlab.nn import kernel_build

    dec, why = LeanDecoder.open(resolve(model))
    if dec is None:
        raise SystemExit(f"the torch-free decoder does not run here: {why}")
    spent: dict[str, float] = {}
    timing = [False]
    call = kernel_build.call_bound

    def timed(fn: str, *values) -> None:
        if not timing[0]:
            return call(fn, *values)
        start = time.perf_counter()
        try:
            return call(fn, *values)
        finally:
            spent[fn] = spent.get(fn, 0.0) + time.perf_counter() - start
    kernel_build.call_bound = timed  # lean.py looks it up on the module at each call

    ids = np.random.default_rng(0).integers(100, dec.cfg.vocab_size, 16).tolist()
    list(dec.greedy(ids, 4))  # warm-up: the library, the pool's threads
    best = None
    for _ in range(rounds):
        spent.clear()
        steps = dec.greedy(ids, new_tokens + 1)
        next(steps)  # the prompt's pass: not timed (llama-bench's tg128 decodes with no prompt)
        timing[0] = True
        start = time.perf_counter()
        count = sum(1 for _ in steps)
        total = time.perf_counter() - start
        timing[0] = False
        if count != new_tokens:
            raise SystemExit(f"expected {new_tokens} decoding steps, got {count}")
        if best is None or total < best["total_s"]:
            best = {"total_s": total, "calls_s": dict(spent)}
    kernel_build.call_bound = call
    return {"tokens": new_tokens, "bytes_per_token": step_bytes(dec), **best}


def report(res: dict, gb_s: float, threads: int) -> str:
    n, total = res["tokens"], res["total_s"]
    rows = sorted(res["calls_s"].items(), key=lambda kv: -kv[1])
    rest = total - sum(s for _, s in rows)
    lines = [f"{'part':<24} {'ms/token':>9} {'share':>7}"]
    for name, s in rows + [("the rest (Python, numpy)", rest)]:
        lines.append(f"{name:<24} {1e3 * s / n:9.3f} {100 * s / total:6.1f}%")
    lines.append(f"{'step':<24} {1e3 * total / n:9.3f}  = {n / total:.1f} tok/s")
    mb = res["bytes_per_token"] / 1e6
    ceiling = gb_s * 1e9 / res["bytes_per_token"]
    kernels = sum(s for _, s in rows)
    lines.append(f"weights read per token: {mb:.1f} MB; in the C calls that is {mb * n / kernels / 1e3:.1f} GB/s; "
                 f"this core streams {gb_s:.1f} GB/s (numpy sum, 256 MB), a ceiling of {ceiling:.0f} tok/s "
                 f"({threads} thread{'s' if threads > 1 else ''}: the ceiling is one core's)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", help="a GGUF file or a name attnlab resolves (default smollm2)")
    ap.add_argument("--new-tokens", type=int, default=128, help="decoding steps timed (default 128)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds; the fastest is reported (default 3)")
    ap.add_argument("--threads", type=int, default=1, help="the C steps' threads (default 1)")
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON line instead")
    args = ap.parse_args(argv)
    if args.new_tokens < 1 or args.rounds < 1 or args.threads < 1:
        ap.error("--new-tokens, --rounds and --threads must be 1 or more")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # read by inference/lean.threads() at each run
    res = measure(args.model, args.new_tokens, args.rounds)
    gb_s = stream_gb_s()
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    if args.json:
        print(json.dumps({**res, "stream_gb_s": gb_s, "threads": args.threads, "load": load}))
        return
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {args.model}; {args.threads} thread(s); "
          f"best of {args.rounds} rounds of {args.new_tokens} steps after a 16-token prompt; load {load}")
    print(report(res, gb_s, args.threads))


if __name__ == "__main__":
    main()
