"""The learning curve: a task's main metric against the number of labeled training examples, for
pretrained models (--model M) and the same architectures trained from random weights (--scratch
M). Each point is a real `attnlab finetune` run on a seeded random subset, and every point is
scored on the same validation examples. Writes curve.json, curve.md (mean ± std over seeds),
curve.png and runs/ into --output; the same command run again skips the runs curve.json already
holds.

examples:
  attnlab curve sst2 --model minilm --scratch minilm --sizes 100,250,1k --output runs/curve
  attnlab curve sst2 --model minilm --sizes 100,250,1k,4k,all --seeds 1,2,3 --output runs/curve3

Guide: docs/guides/fine-tuning.md (more on curves: docs/guides/command-details.md)
"""
from __future__ import annotations

import argparse

NAME = "curve"
HELP = "accuracy against number of labeled examples, pretrained vs scratch"


class _AddModel(argparse.Action):
    """--model and --scratch both append to `models`, so the columns keep the command line's order."""

    def __call__(self, parser, namespace, value, option_string=None):
        from ..tasks.curve import ModelSpec
        setattr(namespace, self.dest, [*getattr(namespace, self.dest), value])  # checked by cli/paths.py
        namespace.models = [*(getattr(namespace, "models", None) or []), ModelSpec(value, self.const)]


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .choices import TASKS as TASK_NAMES  # attnlab.tasks' names, without importing torch
    p.add_argument("task", metavar="TASK", choices=TASK_NAMES, help=", ".join(TASK_NAMES))
    p.add_argument("--model", action=_AddModel, const=False, default=[], metavar="MODEL",
                   help="a model as it is (directory or packaged name); repeat for several")
    p.add_argument("--scratch", action=_AddModel, const=True, default=[], metavar="MODEL",
                   help="MODEL's architecture from random weights; repeat for several")
    p.add_argument("--sizes", default="100,250,1k,4k,all",
                   help="labeled training examples per point, comma-separated; 1k = 1000, all = the whole "
                        "training data (default 100,250,1k,4k,all)")
    p.add_argument("--seeds", default="42", help="seeds (subset drawn + training), comma-separated; the table "
                                                "shows mean ± std over them (default 42)")
    p.add_argument("--output", required=True, help="directory for curve.json, curve.md, curve.png and runs/")
    p.add_argument("--train", help="training file (default: the task's file under ATTNLAB_DATA)")
    p.add_argument("--valid", help="validation file (default: the task's dev file, or finetune's held-out part)")
    p.add_argument("--epochs", type=float, help="passes over each subset (finetune's task default)")
    p.add_argument("--lr", type=float, help="peak learning rate (task default)")
    p.add_argument("--batch-size", type=int, help="examples per step (task default)")
    p.add_argument("--max-length", type=int, help="tokens per input (task default)")
    p.add_argument("--train-embeddings", action="store_true", help="also update the word embeddings (frozen by default)")
    p.add_argument("--pooling", choices=("cls", "mean"),
                   help="classifier's sentence vector: pooled [CLS] or mean over tokens (finetune's default rule)")
    p.add_argument("--keep-models", action="store_true", help="keep every run's fine-tuned weights")


def run(args: argparse.Namespace) -> int:
    from ..tasks.curve import learning_curve, parse_sizes
    if not getattr(args, "models", None):
        raise ValueError("give at least one --model or --scratch")
    try:
        seeds = tuple(int(s) for s in args.seeds.split(",") if s.strip())
    except ValueError:
        raise ValueError(f"--seeds: {args.seeds!r} is not a comma-separated list of integers") from None
    options = {k: v for k, v in dict(epochs=args.epochs, lr=args.lr, batch_size=args.batch_size,
                                      max_length=args.max_length, pooling=args.pooling).items() if v is not None}
    if args.train_embeddings:
        options["freeze_embeddings"] = False
    learning_curve(args.task, args.models, parse_sizes(args.sizes), args.output, seeds=seeds or (42,),
                   train_file=args.train, valid_file=args.valid, keep_models=args.keep_models, **options)
    out = args.output.rstrip("/")
    print(open(f"{out}/curve.md", encoding="utf-8").read(), end="")
    for name in ("curve.md", "curve.png", "curve.json"):
        print(f"wrote {out}/{name}")
    return 0
