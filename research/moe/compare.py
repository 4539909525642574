"""A mixture of experts vs the dense model of equal *active* parameters, at the same wall-clock (issue 24).

Both are configs/pretrain-moe-shakespeare-char.yaml (char-level tiny_shakespeare, 4 layers x 128, context
64, batch 12): the MoE has 8 SwiGLU experts of width 256 and top-2 routing, the dense model one SwiGLU FFN
of width 512, i.e. the same FFN parameters per token (plus the MoE's 128 x 8 router per layer). Each runs
`--minutes` of wall-clock (train.max_minutes) on one thread under `nice`, one after the other; the cosine
schedule is the recipe's 2000 steps, so both stop by time, mid-schedule, at whatever step they reached.

    python research/moe/compare.py --out runs/moe-vs-dense              # train both (2 x 8 min), then report
    python research/moe/compare.py --out runs/moe-vs-dense --report     # report existing runs only

Prints one row per run: steps, tokens/s (median of the logged intervals), final validation loss,
bits per byte, expert shares (min / max of eval_expert_share_j; 1/8 = 0.125 is balanced) and the load.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "configs" / "pretrain-moe-shakespeare-char.yaml"
DENSE = ["model.num_experts=0", "model.intermediate_size=512", "model.model_type=llama"]


def train(out: Path, minutes: float) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.setdefault("ATTNLAB_DATA", "/work/shared/data")
    common = [f"train.max_minutes={minutes}", "train.eval_every=500", "train.save_every=0",
              f"data.path={out / 'corpus'}"]
    for name, extra in (("moe", []), ("dense", DENSE)):
        cmd = ["nice", "-n", "5", sys.executable, "-m", "attnlab", "pretrain", "--no-progress", "--config",
               str(RECIPE), *common, *extra, f"train.output_dir={out / name}"]
        print(" ".join(cmd), file=sys.stderr)
        subprocess.run(cmd, check=True, env=env)


def report(out: Path) -> list[dict]:
    rows = []
    for name in ("moe", "dense"):
        summary = json.loads((out / name / "summary.json").read_text())
        shares = [v for k, v in summary.items() if k.startswith("eval_expert_share_")]
        rows.append(dict(run=name, steps=summary["steps"], elapsed_s=summary["elapsed_s"],
                         tokens_per_s=summary["tokens_per_s"], eval_loss=summary["eval_loss"],
                         bits_per_byte=summary["eval_bits_per_byte"],
                         expert_share_min=min(shares) if shares else None,
                         expert_share_max=max(shares) if shares else None, load=summary["load_average"]))
    print("| run | steps | wall s | tokens/s | val loss | bits/byte | expert share min-max | load (1/5/15 min) |")
    print("|---|---:|---:|---:|---:|---:|---|---|")
    for r in rows:
        share = f"{r['expert_share_min']:.3f}-{r['expert_share_max']:.3f}" if r["expert_share_min"] else "-"
        print(f"| {r['run']} | {r['steps']} | {r['elapsed_s']:.0f} | {r['tokens_per_s']:,.0f} | {r['eval_loss']:.4f} "
              f"| {r['bits_per_byte']:.3f} | {share} | {' '.join(f'{x:.1f}' for x in r['load'])} |")
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "moe-vs-dense")
    p.add_argument("--minutes", type=float, default=8.0)
    p.add_argument("--report", action="store_true", help="only report runs already in --out")
    args = p.parse_args()
    if not args.report:
        train(args.out, args.minutes)
    report(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
