"""Distil a teacher into a shallower student, DistilBERT's way (Sanh et al. 2019): the student starts
from every other teacher layer and learns from the teacher's soft targets, the hard labels and the
teacher's hidden states. --style tinybert / minilm add layer-to-layer terms and allow a narrower
student (--student-width). Two modes: --corpus, a masked-LM teacher on a corpus from `attnlab
prepare`; or --task, a teacher fine-tuned on the task (the student is saved as `attnlab finetune`
saves).

examples:
  attnlab distill --task sst2 --teacher runs/sst2 --student-layers 3 --output runs/s3 --epochs 1
  attnlab distill --task sst2 --teacher runs/sst2 --student-layers 3 --style tinybert --output t3
  attnlab distill --teacher runs/bert-mini --corpus runs/corpus --student-layers 2 --output runs/d2

Guides: docs/guides/pretraining-and-distillation.md; each style's weights and the layer map:
docs/guides/command-details.md
"""
from __future__ import annotations

import argparse

NAME = "distill"
HELP = "distil a teacher into a smaller student (DistilBERT, TinyBERT, MiniLM)"


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected teacher layer numbers separated by commas, e.g. 1,3,5")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .choices import DISTILL_STYLES
    from .choices import TASKS as TASK_NAMES  # attnlab.tasks' names, without importing torch
    p.add_argument("--teacher", required=True, help="teacher model directory (Hugging Face layout): with an MLM "
                                                    "head for --corpus, fine-tuned on TASK for --task")
    p.add_argument("--corpus", help="prepared corpus directory (attnlab prepare; holds tokenizer/)")
    p.add_argument("--task", choices=TASK_NAMES, metavar="TASK",
                   help="distil a teacher fine-tuned on TASK (one of finetune's) on its data instead")
    p.add_argument("--student-layers", type=int, required=True, metavar="N",
                   help="student depth (distilbert: initialised from every other teacher layer)")
    p.add_argument("--output", required=True, help="run directory: metrics.jsonl, checkpoints/step-N/model")
    p.add_argument("--layout", choices=("same", "distilbert"), default="same",
                   help="student layout: the teacher's family, or DistilBERT's (no token types, no pooler)")
    p.add_argument("--max-steps", type=int, default=1000, metavar="N",
                   help="--corpus mode: optimizer steps (default 1000)")
    p.add_argument("--train", help="--task mode: training file (default: the task's under ATTNLAB_DATA)")
    p.add_argument("--valid", help="--task mode: validation file (default: the task's dev file or a held-out part)")
    p.add_argument("--epochs", type=float, help="--task mode: passes over the task's training data (task default)")
    p.add_argument("--max-length", type=int, help="--task mode: tokens per input (task default)")
    p.add_argument("--batch-size", type=int, help="examples per step (default 32, or the task's)")
    p.add_argument("--seq-len", type=int, default=128, metavar="N", help="--corpus mode: tokens per row (default 128)")
    p.add_argument("--lr", type=float, help="peak learning rate (default 5e-4, or the task's)")
    p.add_argument("--warmup-steps", type=int, default=0, metavar="N", help="learning-rate warmup steps (default 0)")
    p.add_argument("--style", choices=DISTILL_STYLES, default="distilbert",
                   help="each paper's mix of loss terms; the --alpha-* and --temperature options override it")
    p.add_argument("--student-width", type=int, metavar="N",
                   help="--task mode: a narrower student (e.g. 192 for a 384-wide teacher)")
    p.add_argument("--student-heads", type=int, metavar="N",
                   help="--task mode: heads of a narrower student (default the teacher's; "
                        "attention transfer needs them equal)")
    p.add_argument("--layer-map", type=_int_list, help="teacher layer (0-based) each student layer learns from, "
                                                       "e.g. 1,3,5 (default: uniform, TinyBERT's)")
    p.add_argument("--max-train-samples", type=int, metavar="N",
                   help="--task mode: distil on a seeded random subset of this size")
    p.add_argument("--temperature", type=float, help="softmax temperature of the soft targets (style's; distilbert 2)")
    p.add_argument("--alpha-ce", type=float, help="weight of the soft-target KL (style's; distilbert 5)")
    p.add_argument("--alpha-mlm", type=float,
                   help="weight of the hard-label loss: MLM, or the task's (style's; distilbert 2)")
    p.add_argument("--alpha-cos", type=float, help="weight of the hidden-state cosine loss (style's; distilbert 1)")
    p.add_argument("--alpha-attn", type=float, help="weight of the attention-distribution KL (style's)")
    p.add_argument("--alpha-hidden", type=float, help="weight of the projected hidden-state MSE (style's)")
    p.add_argument("--alpha-embed", type=float, help="weight of the projected embedding MSE (style's)")
    p.add_argument("--alpha-value", type=float, help="weight of MiniLM's value-relation KL (style's)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")


def config_from_args(args: argparse.Namespace):
    """The style's weights (a DistillConfig), each overridden by its option when given."""
    from ..objectives.distill import STYLES, DistillConfig
    given = dict(temperature=args.temperature, alpha_ce=args.alpha_ce, alpha_task=args.alpha_mlm,
                 alpha_cos=args.alpha_cos, alpha_attn=args.alpha_attn, alpha_hidden=args.alpha_hidden,
                 alpha_embed=args.alpha_embed, alpha_value=args.alpha_value)
    return DistillConfig(**{**STYLES[args.style], **{k: v for k, v in given.items() if v is not None}},
                         layer_map=args.layer_map)


def _check_layer_map(args: argparse.Namespace) -> str | None:
    """A bad --layer-map, found from the teacher's config.json before anything loads (None: fine, or a
    teacher in attnlab's own layout, whose map is checked when it loads)."""
    from ..interop.hf import config_from_hf_dir
    from ..interop.local import resolve
    from ..objectives.layer_distill import check_layer_map
    path = resolve(args.teacher)
    if args.layer_map is None or not (path / "config.json").exists():
        return None
    try:
        check_layer_map(args.layer_map, config_from_hf_dir(path)[0].num_layers, args.student_layers)
    except ValueError as err:
        return f"--layer-map {err}"
    return None


def run(args: argparse.Namespace) -> int:
    import sys

    from ..training.distill import distill
    cfg = config_from_args(args)
    if (args.task is None) == (args.corpus is None):
        raise ValueError("distill: give exactly one of --corpus (a masked-LM teacher) or --task (a fine-tuned one)")
    problem = _check_layer_map(args)
    if problem is None and args.corpus is not None and (args.student_width or args.student_heads or cfg.layer_terms):
        problem = "--student-width, --student-heads and the tinybert / minilm terms work in --task mode only"
    if problem:  # bad usage: one line and status 2, like argparse's own errors
        print(f"attnlab distill: error: {problem}", file=sys.stderr)
        return 2
    if args.task is not None:
        import json

        from ..tasks.finetune import finetune
        summary = finetune(args.task, args.teacher, args.output, train_file=args.train, valid_file=args.valid,
                           epochs=args.epochs, lr=args.lr,
                           batch_size=args.batch_size, max_length=args.max_length, seed=args.seed,
                           max_train_samples=args.max_train_samples, student_layers=args.student_layers,
                           student_width=args.student_width, student_heads=args.student_heads,
                           distill=cfg, progress=args.progress)
        print(json.dumps(summary))
        return 0
    metrics = distill(args.teacher, args.corpus, args.output, args.student_layers, layout=args.layout,
                      seq_len=args.seq_len, batch_size=args.batch_size or 32, max_steps=args.max_steps,
                      lr=args.lr or 5e-4,
                      warmup_steps=args.warmup_steps, cfg=cfg, seed=args.seed, progress=args.progress)
    if metrics:
        print(" ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
    return 0
