"""Distil a masked-LM teacher into a shallower student, DistilBERT's way (Sanh et al. 2019): the student
starts from every other teacher layer and learns from soft targets at temperature T, the MLM labels and
the teacher's hidden-state directions (attnlab/objectives/distill.py).

examples:
  attnlab distill --teacher runs/bert-mini/checkpoints/step-002000/model --corpus runs/corpus-gutenberg-wikitext-bert \
      --student-layers 2 --output runs/bert-mini-distilled --max-steps 500
  attnlab distill --teacher DIR --corpus CORPUS --student-layers 6 --layout distilbert --temperature 2
"""
from __future__ import annotations

import argparse

NAME = "distill"
HELP = "distil a masked-LM teacher into a student with fewer layers (DistilBERT)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--teacher", required=True, help="teacher model directory (Hugging Face layout, with an MLM head)")
    p.add_argument("--corpus", required=True, help="prepared corpus directory (attnlab prepare; holds tokenizer/)")
    p.add_argument("--student-layers", type=int, required=True, help="student depth (initialised from every other teacher layer)")
    p.add_argument("--output", required=True, help="run directory: metrics.jsonl, checkpoints/step-N/model")
    p.add_argument("--layout", choices=("same", "distilbert"), default="same",
                   help="student layout: the teacher's family, or DistilBERT's (no token types, no pooler)")
    p.add_argument("--max-steps", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--warmup-steps", type=int, default=0)
    p.add_argument("--temperature", type=float, default=2.0, help="softmax temperature of the soft targets (default 2)")
    p.add_argument("--alpha-ce", type=float, default=5.0, help="weight of the soft-target KL (default 5)")
    p.add_argument("--alpha-mlm", type=float, default=2.0, help="weight of the MLM loss on the labels (default 2)")
    p.add_argument("--alpha-cos", type=float, default=1.0, help="weight of the hidden-state cosine loss (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from ..objectives.distill import DistillConfig, distill
    cfg = DistillConfig(temperature=args.temperature, alpha_ce=args.alpha_ce, alpha_task=args.alpha_mlm,
                        alpha_cos=args.alpha_cos)
    metrics = distill(args.teacher, args.corpus, args.output, args.student_layers, layout=args.layout,
                      seq_len=args.seq_len, batch_size=args.batch_size, max_steps=args.max_steps, lr=args.lr,
                      warmup_steps=args.warmup_steps, cfg=cfg, seed=args.seed, progress=args.progress)
    if metrics:
        print(" ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
    return 0
