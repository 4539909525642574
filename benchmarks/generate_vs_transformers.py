"""Greedy decoding speed, attnlab vs transformers `generate`, on the real SmolLM2-135M-Instruct weights (the
packaged GGUF, dequantized to fp32 by both), in one process.

    .venv/bin/python benchmarks/generate_vs_transformers.py [--batch 1 8] [--new-tokens 128] [--bf16] [--compile]

For each batch size: new tokens/s for both (best of --repeats runs, interleaved so that load from other
processes hits both alike), the ratio, and the fraction of the memory-bandwidth bound reached: a decoding
step must read every weight once, so steps/s <= bandwidth / weight bytes (fp32: 4 bytes per parameter).
--bf16 also times attnlab with bf16 weights and reports how far its logits move from fp32.
--compile also times attnlab's compiled decoding (`generate(..., compile=True)`: static KV cache, frozen
weights, autotuned C++ GEMMs); its one-off compile time is printed separately, not counted in tokens/s.
Not a test: numbers depend on the machine and on what else runs on it.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import attnlab  # noqa: E402
from attnlab.inference.generate import generate  # noqa: E402
from attnlab.interop.local import resolve  # noqa: E402


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--bandwidth-gbs", type=float, default=31.0, help="memory bandwidth of this machine, GB/s")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--bf16", action="store_true", help="also time attnlab with bf16 weights")
    ap.add_argument("--compile", action="store_true", help="also time attnlab with compile=True (compiles for minutes)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers  # the oracle: imported here only
    from transformers import AutoModelForCausalLM
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()

    path = resolve("smollm2")
    ours = attnlab.load(path)
    theirs = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    params = ours.num_parameters()
    weight_bytes = params * 4
    bound_steps = args.bandwidth_gbs * 1e9 / weight_bytes
    print(f"SmolLM2-135M: {params:,} parameters = {weight_bytes / 1e6:.0f} MB in fp32; bandwidth bound at "
          f"{args.bandwidth_gbs:g} GB/s = {bound_steps:.1f} decoding steps/s; torch threads {torch.get_num_threads()}",
          flush=True)
    n = args.new_tokens

    def run_ours(model, ids, compile=False):
        return generate(model, ids, max_new_tokens=n, eos_token_id=[], compile=compile)

    def run_theirs(ids):
        with torch.inference_mode():
            return theirs.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                   do_sample=False, pad_token_id=2)

    rows = []
    for b in args.batch:
        torch.manual_seed(0)
        ids = torch.randint(100, 40000, (b, args.prompt_tokens))
        run_ours(ours, ids[:, :4])  # warm-up (allocator, kernels)
        run_theirs(ids[:, :4])
        t_ours, t_theirs = [], []
        for _ in range(args.repeats):
            t_ours.append(timed(lambda: run_ours(ours, ids)))
            t_theirs.append(timed(lambda: run_theirs(ids)))
        ours_ids, theirs_ids = run_ours(ours, ids), run_theirs(ids)
        same = torch.equal(ours_ids, theirs_ids)
        a, h = b * n / min(t_ours), b * n / min(t_theirs)
        frac = (n / min(t_ours)) / bound_steps
        rows.append((b, "attnlab", a, h, a / h, frac, same))
        print(f"  batch {b}: attnlab {a:.1f} tok/s, transformers {h:.1f} tok/s, same ids: {same}", flush=True)
        if args.compile:
            took = timed(lambda: run_ours(ours, ids, compile=True))  # compiles this (batch, capacity)
            t_c = min(timed(lambda: run_ours(ours, ids, compile=True)) for _ in range(args.repeats))
            c = b * n / t_c
            fast = run_ours(ours, ids, compile=True)
            same_c = torch.equal(fast, theirs_ids)
            rows.append((b, "compiled", c, h, c / h, (n / t_c) / bound_steps, same_c))
            print(f"  batch {b}: attnlab compiled {c:.1f} tok/s ({c / a:.2f}x eager; first call incl. compiling "
                  f"took {took:.0f} s), same ids: {same_c}, same ids as eager attnlab: "
                  f"{torch.equal(fast, ours_ids)}", flush=True)
        if args.bf16:
            low = attnlab.load(path, dtype=torch.bfloat16)
            run_ours(low, ids[:, :4])
            t_low = min(timed(lambda: run_ours(low, ids)) for _ in range(args.repeats))
            with torch.inference_mode():
                dev = (low(ids).logits.float() - ours(ids).logits).abs().max().item()
            print(f"  batch {b} bf16 weights: {b * n / t_low:.1f} new tokens/s ({(b * n / t_low) / a:.2f}x fp32), "
                  f"max |logit - fp32 logit| = {dev:.3g}", flush=True)

    print(f"\ngreedy, {args.prompt_tokens}-token prompt, {n} new tokens, fp32, best of {args.repeats}")
    print(f"{'batch':>5} {'attnlab':>9} {'tok/s':>8} {'transformers tok/s':>19} {'ratio':>6} {'of bw bound':>12} "
          f"{'same ids':>9}")
    for b, kind, a, h, r, frac, same in rows:
        print(f"{b:>5} {kind:>9} {a:>8.1f} {h:>19.1f} {r:>5.2f}x {frac:>11.0%} {str(same):>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
