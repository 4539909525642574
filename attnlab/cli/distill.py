"""Distil a teacher into a shallower student, DistilBERT's way (Sanh et al. 2019): the student starts
from every other teacher layer and learns from soft targets at temperature T, the hard labels and the
teacher's hidden-state directions (attnlab/objectives/distill.py).

--style tinybert / minilm (task mode) add layer-to-layer terms (attnlab/objectives/layer_distill.py):
TinyBERT (Jiao et al. 2020) matches attention distributions and, through learned projections, hidden
states and embeddings on mapped layers (uniform: student layer i <- teacher layer (i+1)N/M - 1, or
--layer-map); MiniLM (Wang et al. 2020) matches the last layer's attention and value relation. Both let
the student be narrower (--student-width): its embeddings, pooler and classifier start from the teacher's
through a PCA basis, its layers from random weights.

Two modes: a masked-LM teacher on a prepared corpus (--corpus; pretraining distillation), or a teacher
already fine-tuned on a task (--task; the student keeps the teacher's head and is trained on the task's
data, then saved like `attnlab finetune` saves: best checkpoint, metrics.json).

examples:
  attnlab distill --task sst2 --teacher runs/sst2 --student-layers 3 --output runs/sst2-3layers --epochs 1
  attnlab distill --teacher runs/bert-mini/checkpoints/step-002000/model --corpus runs/corpus-gutenberg-wikitext-bert \
      --student-layers 2 --output runs/bert-mini-distilled --max-steps 500
  attnlab distill --teacher DIR --corpus CORPUS --student-layers 6 --layout distilbert --temperature 2
  attnlab distill --task sst2 --teacher runs/sst2 --student-layers 3 --student-width 192 --style tinybert \
      --output runs/sst2-tiny --max-train-samples 8000
  attnlab distill --task sst2 --teacher runs/sst2 --student-layers 3 --student-width 192 --style minilm \
      --output runs/sst2-minilm
  attnlab distill --task sst2 --teacher runs/sst2 --student-layers 2 --style tinybert --layer-map 2,5 --output runs/s2
"""
from __future__ import annotations

import argparse

NAME = "distill"
HELP = "distil a masked-LM or fine-tuned teacher into a smaller student (DistilBERT, TinyBERT, MiniLM)"


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected teacher layer numbers separated by commas, e.g. 1,3,5")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..objectives.distill import STYLES
    from ..tasks import TASK_NAMES
    p.add_argument("--teacher", required=True, help="teacher model directory (Hugging Face layout): with an MLM "
                                                    "head for --corpus, fine-tuned on TASK for --task")
    p.add_argument("--corpus", help="prepared corpus directory (attnlab prepare; holds tokenizer/)")
    p.add_argument("--task", choices=TASK_NAMES, help="distil a fine-tuned teacher on this task's data instead "
                                                      f"({', '.join(TASK_NAMES)})")
    p.add_argument("--student-layers", type=int, required=True,
                   help="student depth (distilbert: initialised from every other teacher layer)")
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
    p.add_argument("--style", choices=sorted(STYLES), default="distilbert",
                   help="each paper's mix of loss terms (the --alpha-* and --temperature options override it): "
                        + "; ".join(f"{k}: " + ", ".join(f"{n}={v}" for n, v in w.items()) for k, w in STYLES.items()))
    p.add_argument("--student-width", type=int,
                   help="--task mode: a narrower student (e.g. 192 for a 384-wide teacher)")
    p.add_argument("--student-heads", type=int, help="--task mode: heads of a narrower student (default the teacher's; "
                                                     "attention transfer needs them equal)")
    p.add_argument("--layer-map", type=_int_list, help="teacher layer (0-based) each student layer learns from, "
                                                       "e.g. 1,3,5 (default: uniform, TinyBERT's)")
    p.add_argument("--max-train-samples", type=int, help="--task mode: distil on a seeded random subset of this size")
    p.add_argument("--temperature", type=float, help="softmax temperature of the soft targets (style's; distilbert 2)")
    p.add_argument("--alpha-ce", type=float, help="weight of the soft-target KL (style's; distilbert 5)")
    p.add_argument("--alpha-mlm", type=float,
                   help="weight of the hard-label loss: MLM, or the task's (style's; distilbert 2)")
    p.add_argument("--alpha-cos", type=float, help="weight of the hidden-state cosine loss (style's; distilbert 1)")
    p.add_argument("--alpha-attn", type=float, help="weight of the attention-distribution KL (style's)")
    p.add_argument("--alpha-hidden", type=float, help="weight of the projected hidden-state MSE (style's)")
    p.add_argument("--alpha-embed", type=float, help="weight of the projected embedding MSE (style's)")
    p.add_argument("--alpha-value", type=float, help="weight of MiniLM's value-relation KL (style's)")
    p.add_argument("--seed", type=int, default=0)
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
