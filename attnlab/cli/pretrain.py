"""Pretrain a model from a YAML recipe (see configs/pretrain-*.yaml and attnlab/training/pretrain.py).

Overrides are dotted key=value pairs; unknown keys are errors. The same command runs data-parallel
under torchrun (DDP; gloo on CPU, nccl on CUDA). Outputs go to train.output_dir: metrics.jsonl,
config.yaml, tokenizer/, checkpoints/step-N/{model,trainer.pt}.

Checkpoints are written atomically, so a run killed at any moment resumes exactly with --resume. A
checkpoint that cannot be written (e.g. a full disk) or a NaN/inf loss stops the run with one line
naming the checkpoint or step and the last good checkpoint (exit status 1); train.nan_policy=skip
skips such steps instead (at most train.max_skips, counted in metrics.jsonl).

examples:
  attnlab pretrain --config configs/pretrain-bert-mini.yaml train.max_steps=200
  attnlab pretrain --config configs/pretrain-gpt-shakespeare-char.yaml --resume
  torchrun --nproc_per_node=2 -m attnlab pretrain --config configs/pretrain-bert-mini.yaml
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
