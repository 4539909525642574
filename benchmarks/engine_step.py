"""The serving engine's decoding step on a GGUF model kept quantized: one C call for the layer stack
(`PagedBlockSteps`, the engine's default there) against the same step through the modules, side by side.

    .venv/bin/python benchmarks/engine_step.py [--model smollm2] [--rows 1,4,16,64] [--context 300]
        [--threads 2] [--rounds 3] [--offline 96]

Per row count: that many requests with --context-token prompts are prefilled, then the two steps take turns
for --rounds rounds of 5 decoding steps each; the table gives the best round of each and their ratio.
--offline N: then the engine alone on the first N requests of benchmarks/serve_requests.jsonl (chat
template, EOS ignored, 64 rows at most), whole runs taking turns C, modules, modules, C; output tokens/s.
OMP_WAIT_POLICY=PASSIVE as `attnlab serve` sets it. Not a test: figures depend on the machine and load.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch starts its OpenMP threads

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, table  # noqa: E402


def step_times(model, tok, rows: int, context: int, rounds: int) -> tuple[float, float]:
    from attnlab.inference.engine import Engine, SamplingParams
    engine = Engine(model, tok, num_blocks=2048, max_batch=max(64, rows))
    c_step = engine.block_steps
    if c_step is None:
        raise SystemExit("this model or machine does not take the C step (see PagedBlockSteps.usable)")
    g = torch.Generator().manual_seed(0)
    reqs = [engine.add_request(torch.randint(100, 20000, (context,), generator=g).tolist(),
                               SamplingParams(max_new_tokens=10 * rounds + 10, ignore_eos=True)) for _ in range(rows)]
    while any(r.table.length < len(r.prompt) for r in reqs):
        engine.step()
    best = {"c": float("inf"), "modules": float("inf")}
    for _ in range(rounds):
        for side in best:
            engine.block_steps = c_step if side == "c" else None
            t = time.perf_counter()
            for _ in range(5):
                engine.step()
            best[side] = min(best[side], (time.perf_counter() - t) / 5)
    return best["c"], best["modules"]


def offline(model, tok, n: int) -> list[list]:
    from attnlab.inference.chat import apply_chat_template
    from attnlab.inference.engine import Engine, SamplingParams
    lines = (REPO / "benchmarks" / "serve_requests.jsonl").read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines if line.strip()][:n]
    prompts = [tok.encode(apply_chat_template(tok, r["messages"]), add_special_tokens=False) for r in rows]
    params = [SamplingParams(max_new_tokens=r["max_tokens"], ignore_eos=True) for r in rows]
    out = []
    for side in ("c", "modules", "modules", "c"):
        engine = Engine(model, tok, num_blocks=2048, max_batch=64)
        if side == "modules":
            engine.block_steps = None
        t = time.perf_counter()
        tokens = sum(map(len, engine.generate(prompts, params)))
        wall = time.perf_counter() - t
        out.append([side, tokens, f"{wall:.1f}", f"{tokens / wall:.1f}"])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--rows", default="1,4,16,64")
    p.add_argument("--context", type=int, default=300)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--offline", type=int, default=0, help="then the engine alone on N benchmark requests")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    import attnlab
    model, tok = attnlab.load(args.model, quantized=True), attnlab.load_tokenizer(args.model)
    print(f"{args.model} kept quantized, {args.threads} threads, load {os.getloadavg()[0]:.2f}; rows of "
          f"{args.context} cached tokens, best of {args.rounds} rounds of 5 steps, sides taking turns")
    out = []
    for rows in (int(r) for r in args.rows.split(",")):
        c, m = step_times(model, tok, rows, args.context, args.rounds)
        out.append([rows, f"{c * 1e3:.1f}", f"{m * 1e3:.1f}", f"{m / c:.2f}x"])
    print(table(out, ["rows", "C step ms", "modules ms", "speed-up"]))
    if args.offline:
        print(f"\nthe engine alone on {args.offline} requests of serve_requests.jsonl (load {os.getloadavg()[0]:.2f})")
        print(table(offline(model, tok, args.offline), ["step", "out tokens", "seconds", "tok/s"]))


if __name__ == "__main__":
    main()
