"""Distil a teacher into a shallower student, DistilBERT's way (Sanh et al. 2019): the student starts
from every other teacher layer and learns from soft targets at temperature T, the hard labels and the
teacher's hidden-state directions (attnlab/objectives/distill.py).

Two modes: a masked-LM teacher on a prepared corpus (--corpus; pretraining distillation), or a teacher
already fine-tuned on a task (--task; the student keeps the teacher's head and is trained on the task's
data, then saved like `attnlab finetune` saves: best checkpoint, metrics.json).

examples:
  attnlab distill --task sst2 --teacher runs/sst2 --student-layers 3 --output runs/sst2-3layers --epochs 1
  attnlab distill --teacher runs/bert-mini/checkpoints/step-002000/model --corpus runs/corpus-gutenberg-wikitext-bert \
      --student-layers 2 --output runs/bert-mini-distilled --max-steps 500
  attnlab distill --teacher DIR --corpus CORPUS --student-layers 6 --layout distilbert --temperature 2
"""
from __future__ import annotations

import argparse

NAME = "distill"
HELP = "distil a masked-LM or fine-tuned teacher into a student with fewer layers (DistilBERT)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..tasks import TASK_NAMES
    p.add_argument("--teacher", required=True, help="teacher model directory (Hugging Face layout): with an MLM "
                                                    "head for --corpus, fine-tuned on TASK for --task")
    p.add_argument("--corpus", help="prepared corpus directory (attnlab prepare; holds tokenizer/)")
    p.add_argument("--task", choices=TASK_NAMES, help="distil a fine-tuned teacher on this task's data instead "
                                                      f"({', '.join(TASK_NAMES)})")
    p.add_argument("--student-layers", type=int, required=True, help="student depth (initialised from every other teacher layer)")
    p.add_argument("--output", required=True, help="run directory: metrics.jsonl, checkpoints/step-N/model")
    p.add_argument("--layout", choices=("same", "distilbert"), default="same",
                   help="student layout: the teacher's family, or DistilBERT's (no token types, no pooler)")
    p.add_argument("--max-steps", type=int, default=1000, help="--corpus mode: optimizer steps (default 1000)")
    p.add_argument("--train", help="--task mode: training file (default: the task's under ATTNLAB_DATA)")
    p.add_argument("--valid", help="--task mode: validation file (default: the task's dev file or a held-out part)")
    p.add_argument("--epochs", type=float, help="--task mode: passes over the task's training data (task default)")
    p.add_argument("--max-length", type=int, help="--task mode: tokens per input (task default)")
    p.add_argument("--batch-size", type=int, help="examples per step (default 32, or the task's)")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--lr", type=float, help="peak learning rate (default 5e-4, or the task's)")
    p.add_argument("--warmup-steps", type=int, default=0)
    p.add_argument("--temperature", type=float, default=2.0, help="softmax temperature of the soft targets (default 2)")
    p.add_argument("--alpha-ce", type=float, default=5.0, help="weight of the soft-target KL (default 5)")
    p.add_argument("--alpha-mlm", type=float, default=2.0,
                   help="weight of the hard-label loss: MLM, or the task's (default 2)")
    p.add_argument("--alpha-cos", type=float, default=1.0, help="weight of the hidden-state cosine loss (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from ..objectives.distill import DistillConfig
    from ..training.distill import distill
    cfg = DistillConfig(temperature=args.temperature, alpha_ce=args.alpha_ce, alpha_task=args.alpha_mlm,
                        alpha_cos=args.alpha_cos)
    if (args.task is None) == (args.corpus is None):
        raise ValueError("distill: give exactly one of --corpus (a masked-LM teacher) or --task (a fine-tuned one)")
    if args.task is not None:
        import json

        from ..tasks.finetune import finetune
        summary = finetune(args.task, args.teacher, args.output, train_file=args.train, valid_file=args.valid,
                           epochs=args.epochs, lr=args.lr,
                           batch_size=args.batch_size, max_length=args.max_length, seed=args.seed,
                           student_layers=args.student_layers, distill=cfg, progress=args.progress)
        print(json.dumps(summary))
        return 0
    metrics = distill(args.teacher, args.corpus, args.output, args.student_layers, layout=args.layout,
                      seq_len=args.seq_len, batch_size=args.batch_size or 32, max_steps=args.max_steps,
                      lr=args.lr or 5e-4,
                      warmup_steps=args.warmup_steps, cfg=cfg, seed=args.seed, progress=args.progress)
    if metrics:
        print(" ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
    return 0
