"""Average the weights of several fine-tuned runs into one model: a uniform model soup (Wortsman et
al. 2022). The runs must start from the same checkpoint and train the same task (same
architecture, config and labels), differing in seed or data order; the soup has one model's size
and speed.

examples:
  attnlab finetune sst2 --model minilm --output runs/sst2-s1 --seed 1
  attnlab soup runs/sst2-s1 runs/sst2-s2 runs/sst2-s3 --output runs/sst2-soup
  attnlab evaluate sst2 --model runs/sst2-soup --data held-out.tsv

Guides: docs/guides/fine-tuning.md; what soups measured: docs/guides/fine-tuning-defaults.md
"""
from __future__ import annotations

import argparse
import json
import sys

NAME = "soup"
HELP = "average the weights of fine-tuned runs into one model (a model soup)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("models", metavar="MODEL", nargs="+", help="two or more fine-tuned model directories")
    p.add_argument("--output", "-o", required=True, help="directory to write the averaged model into")


def run(args: argparse.Namespace) -> int:
    from ..training.soup import soup
    model = soup(args.models, args.output)
    print(f"soup: averaged {len(args.models)} models into {args.output}", file=sys.stderr)
    print(json.dumps({"output": args.output, "models": args.models, "architecture": type(model).__name__}))
    return 0
