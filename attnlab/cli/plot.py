"""Turn a training run's metrics.jsonl into PNG curves (loss, accuracy / eval metrics, learning rate,
tokens/s) and a short markdown summary, for reports.

examples:
  attnlab plot runs/pretrain-bert-tiny                 # writes runs/pretrain-bert-tiny/plots/*.png + summary.md
  attnlab plot runs/sst2 --output report/sst2
"""
from __future__ import annotations

import argparse

NAME = "plot"
HELP = "PNG training curves and a markdown summary from RUN_DIR/metrics.jsonl"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory holding metrics.jsonl")
    p.add_argument("--output", "-o", help="where to write the PNGs and summary.md (default RUN_DIR/plots)")


def run(args: argparse.Namespace) -> int:
    from ..viz.plots import plot_run
    pngs, summary = plot_run(args.run_dir, args.output)
    print(summary.read_text(encoding="utf-8"), end="")
    for path in [*pngs, summary]:
        print(f"wrote {path}")
    return 0
