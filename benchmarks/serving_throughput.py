"""Serving throughput: 32 requests of mixed prompt/output lengths through attnlab's continuous-batching
engine (paged KV cache) vs transformers `generate`, one request at a time and in static batches.

Model: SmolLM2-135M-Instruct, real weights from the packaged Q4_1 GGUF (dequantized to fp32): attnlab
loads it with its own GGUF loader, transformers loads the same file (`gguf_file=`). Greedy, EOS ignored
on both sides so that every request produces exactly its requested number of tokens. A static batch
runs until its longest request is done (that is what static batching costs); useful tokens are only the
ones each request asked for. Reported: useful tokens/s and ratios, and whether the engine's outputs
equal transformers' one-at-a-time outputs.

--compile also runs the engine with its compiled decode step (torch.compile with freezing and GEMM
autotuning, `Engine(compile=True)`), after the transformers runs so that compiling cannot slow them; its
one-time compile (minutes) happens in `warmup()` and is reported separately, as a server pays it once
at start-up.

usage: .venv/bin/python benchmarks/serving_throughput.py [--requests 32] [--max-new 64] [--threads N] [--compile]
       [--repeats 2]
"""
from __future__ import annotations

import argparse
import random
import time

import torch


def table(rows: list[list], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).rjust(w) for c, w in zip(r, widths))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])

WORDS = ("the quick brown fox jumps over a lazy dog while seven curious engineers measure how fast "
         "tokens flow through a small language model on two busy cores").split()


def workload(n: int, max_new: int, seed: int = 0) -> tuple[list[str], list[int]]:
    rng = random.Random(seed)
    prompts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 60))) for _ in range(n)]
    lengths = [rng.randint(max(2, max_new // 8), max_new) for _ in range(n)]
    return prompts, lengths


@torch.inference_mode()
def hf_generate(model, batch: list[list[int]], max_new: int, pad: int) -> list[list[int]]:
    width = max(len(p) for p in batch)
    ids = torch.full((len(batch), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(batch):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, min_new_tokens=max_new,
                         do_sample=False, pad_token_id=pad)
    return out[:, width:].tolist()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--max-new", type=int, default=64, help="longest requested output (shortest is 1/8 of it)")
    p.add_argument("--batches", default="8,32", help="static batch sizes for transformers")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--compile", action="store_true", help="also the engine with its compiled decode step")
    p.add_argument("--repeats", type=int, default=2, help="best of N for the engine and static-batch runs "
                                                           "(one-at-a-time runs once: it is long)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    import attnlab
    from attnlab.inference.engine import Engine, SamplingParams
    from attnlab.interop.local import resolve

    path = resolve("smollm2")
    ours, tok = attnlab.load(path), attnlab.load_tokenizer(path)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                               dtype=torch.float32).eval()
    theirs.generation_config.eos_token_id = None  # fixed lengths: see the module docstring
    prompts, lengths = workload(args.requests, args.max_new)
    ids = [tok.encode(x, add_special_tokens=False) for x in prompts]
    useful = sum(lengths)
    pad = tok.pad_token_id or 0
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, {len(ids)} requests, prompt tokens "
          f"{min(map(len, ids))}-{max(map(len, ids))}, output tokens {min(lengths)}-{max(lengths)} ({useful} total)")

    rows, engines = [], {}

    def run_engine(compiled: bool) -> None:
        """Everything submitted at once; continuous batching decides."""
        engine = Engine(ours, tok, num_blocks=1 + sum(-(-(len(i) + n) // 16) for i, n in zip(ids, lengths)),
                        block_size=16, max_batch=32, compile=compiled)
        start = time.perf_counter()
        engine.warmup(max(len(i) + n for i, n in zip(ids, lengths)))  # compiles every bucket the run needs
        engine.generate([ids[0]], SamplingParams(max_new_tokens=2, ignore_eos=True))
        if compiled:
            print(f"compiling the engine's decode step (warm-up): {time.perf_counter() - start:.0f} s")
        t = float("inf")
        for _ in range(args.repeats):
            before = dict(engine.stats)
            start = time.perf_counter()
            mine = engine.generate(ids, [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in lengths])
            t = min(t, time.perf_counter() - start)
            stats = {k: engine.stats[k] - before[k] for k in ("preemptions", "steps")}  # this run's
        name = "attnlab engine, compiled decode" if compiled else "attnlab engine (continuous)"
        rows.append([name, f"{t:.1f}", f"{useful / t:.1f}"])
        engines[name] = (t, mine, stats)

    run_engine(False)

    # transformers, one request at a time
    start = time.perf_counter()
    alone = [hf_generate(theirs, [i], n, pad)[0] for i, n in zip(ids, lengths)]
    t_alone = time.perf_counter() - start
    rows.append(["transformers, one at a time", f"{t_alone:.1f}", f"{useful / t_alone:.1f}"])

    best_static = None
    for bs in [int(b) for b in args.batches.split(",")]:
        t = float("inf")
        for _ in range(args.repeats):
            start = time.perf_counter()
            for s in range(0, len(ids), bs):
                hf_generate(theirs, ids[s:s + bs], max(lengths[s:s + bs]), pad)
            t = min(t, time.perf_counter() - start)
        rows.append([f"transformers, static batches of {bs}", f"{t:.1f}", f"{useful / t:.1f}"])
        best_static = t if best_static is None else min(best_static, t)

    if args.compile:
        # last, so that the compile (worker processes, autotuning) cannot slow the transformers runs above
        run_engine(True)

    print(table(rows, ["engine", "seconds", "useful tok/s"]))
    for name, (t, mine, stats) in engines.items():
        same = sum(m == a[:len(m)] for m, a in zip(mine, alone))
        print(f"\n{name} vs transformers one-at-a-time: {t_alone / t:.2f}x (target >= 3x)")
        print(f"{name} vs best transformers static batch: {best_static / t:.2f}x (target >= 1.5x)")
        print(f"greedy outputs equal to transformers one-at-a-time: {same}/{len(ids)} "
              f"(preemptions: {stats['preemptions']}, steps: {stats['steps']})")


if __name__ == "__main__":
    main()
