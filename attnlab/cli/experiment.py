"""The notes' claims as experiments: each runs on this machine and writes NAME.md (the table, the
claim, the verdict computed from the numbers, the settings and the machine), NAME.png and
NAME.json into --output. Where a claim does not hold at this scale, the verdict says so; --tiny
runs a seconds-long version on tiny settings.

examples:
  attnlab experiment --list
  attnlab experiment sqrt-dk
  attnlab experiment parallel --tiny --output runs/experiments

Guide: docs/research/index.md
"""
from __future__ import annotations

import argparse
import sys

NAME = "experiment"
HELP = "rerun one of the notes' claims as a measurement"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", metavar="NAME", help="the experiment (see --list)")
    p.add_argument("--list", action="store_true", help="list the experiments and the claim each one tests")
    p.add_argument("--output", default="experiments-out", help="directory for NAME.md/.png/.json "
                                                              "(default experiments-out)")
    p.add_argument("--tiny", action="store_true", help="a seconds-long version on tiny settings (a smoke test)")
    p.add_argument("--data", help="the data directory (default: ATTNLAB_DATA, else ../shared/data)")
    p.add_argument("--all", action="store_true", help="run every experiment in turn (hours), then "
                                                     "write OUTPUT/EXPERIMENTS.md")
    p.add_argument("--index", action="store_true", help="only write OUTPUT/EXPERIMENTS.md from the results "
                                                       "already in OUTPUT")


def run(args: argparse.Namespace) -> int:
    from ..experiments import EXPERIMENTS, listing, run as run_experiment, write_index
    if args.list:
        for name, claim in listing():
            print(f"{name:15} {claim}")
        return 0
    if args.all or args.index:
        from ..tasks.base import data_root
        for name in EXPERIMENTS if args.all else []:
            print(f"attnlab experiment: {name} ...", file=sys.stderr, flush=True)
            report = run_experiment(name, args.output, tiny=args.tiny, data=args.data or data_root())
            print(f"attnlab experiment: {name}: {report.verdict}", file=sys.stderr, flush=True)
        print(f"wrote {write_index(args.output)}")
        return 0
    if not args.name:
        print("attnlab experiment: error: name an experiment, or --list to see them", file=sys.stderr)
        return 2
    from ..tasks.base import data_root
    report = run_experiment(args.name, args.output, tiny=args.tiny, data=args.data or data_root())
    print(report.markdown())
    print(f"wrote {args.output}/{args.name}.md, .png and .json", file=sys.stderr)
    return 0
