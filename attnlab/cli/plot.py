"""Turn a training run's metrics.jsonl into PNG curves (loss, eval metrics, learning rate, tokens/s)
and a short markdown summary, for reports. Writes RUN_DIR/plots/*.png and summary.md unless
--output.

examples:
  attnlab plot runs/sst2
  attnlab plot runs/sst2 --output report/sst2

Guide: docs/guides/inspection.md
"""
from __future__ import annotations

import argparse

NAME = "plot"
HELP = "training curves (PNG) and a summary from a run's metrics.jsonl"


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
