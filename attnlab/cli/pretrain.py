"""Pretrain a model from a YAML recipe (configs/pretrain-*.yaml): masked LM, MLM + NSP/SOP, or causal
LM. KEY=VALUE pairs override the recipe's dotted keys (an unknown key is an error). Writes into
train.output_dir: metrics.jsonl, config.yaml, tokenizer/ and checkpoints/step-N/; a killed run
resumes exactly with --resume. Under torchrun the same command trains data-parallel.

examples:
  attnlab pretrain --config configs/pretrain-bert-mini.yaml train.max_steps=200
  attnlab pretrain --config configs/pretrain-gpt-shakespeare-char.yaml --resume

Guide: docs/guides/pretraining-and-distillation.md (checkpoints, NaN policy:
docs/guides/command-details.md)
"""
from __future__ import annotations

import argparse

NAME = "pretrain"
HELP = "pretrain a model (MLM, MLM+NSP/SOP or causal LM) from a YAML recipe"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML recipe (configs/pretrain-*.yaml)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="e.g. train.lr=3e-4 data.batch_size=16")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in train.output_dir")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from ..training.pretrain import load_config, pretrain
    cfg = load_config(args.config, args.overrides)
    cfg.train.resume = cfg.train.resume or args.resume
    cfg.train.progress = cfg.train.progress and args.progress
    metrics = pretrain(cfg)
    if metrics:
        print(" ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
    return 0
