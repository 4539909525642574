"""Fine-tune a pretrained encoder on a task and keep the best checkpoint.

TASK says what the data is. Your own files (--train; CSV, TSV or JSONL with a header, columns
found by name): text-classification, sentence-pair-classification, regression,
token-classification (CoNLL or JSONL), question-answering (SQuAD json). Benchmarks, their files
found under ATTNLAB_DATA: sst2, mrpc, rte, cola, stsb, conll2003, squad. And translation
(--train-src/--train-tgt/...). Options left out follow the data (batch size, lr, epochs, pooling;
SetFit below 500 labels; an LM teacher for 500-1,999 SST-2 examples). Writes the best model (with
its label names), metrics.jsonl and metrics.json into --output.

examples:
  attnlab finetune text-classification --model minilm --train reviews.csv --output runs/reviews
  attnlab finetune sst2 --model minilm --output runs/sst2 --max-train-samples 1000
  attnlab finetune sst2 --model minilm --output runs/sst2-lora --lora r=8,alpha=16
  attnlab finetune sst2 --text-to-text --model t5-small --set num_layers=4 --output runs/t5-sst2

Guides: docs/guides/fine-tuning.md; the rules of the defaults and the measurements behind them:
docs/guides/fine-tuning-defaults.md; every option in detail: docs/guides/command-details.md
"""
from __future__ import annotations

import argparse
import json

NAME = "finetune"
HELP = "fine-tune an encoder on a task; writes the model and metrics.json"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .choices import TASKS as TASK_NAMES  # attnlab.tasks' names, without importing torch
    p.add_argument("task", metavar="TASK", choices=(*TASK_NAMES, "translation"), help="what the data is (listed above)")
    p.add_argument("--model", metavar="MODEL", help="a model directory or packaged name (minilm), or a preset")
    p.add_argument("--output", metavar="DIR", required=True, help="directory for the fine-tuned model and metrics")
    p.add_argument("--train", metavar="FILE", help="training file(s), comma-separated (default: the task's own)")
    p.add_argument("--valid", metavar="FILE", help="validation file (default: the task's dev file or a held-out part)")
    add_column_arguments(p)
    p.add_argument("--test", metavar="FILE", help="also score the kept model on this labelled file (test_* metrics)")
    p.add_argument("--epochs", type=float, metavar="N", help="passes over the training data, fractions allowed")
    p.add_argument("--lr", type=float, help="peak learning rate")
    p.add_argument("--batch-size", type=int, metavar="N", help="examples per step")
    p.add_argument("--max-length", type=int, metavar="N", help="tokens per input; longer ones are cut (task default)")
    p.add_argument("--seed", type=int, default=42, metavar="N", help="random seed (default 42)")
    p.add_argument("--eval-every", type=int, metavar="N", help="also evaluate every N steps (default: at epoch ends)")
    p.add_argument("--patience", type=int, metavar="N", help="stop after N evaluations without improvement")
    p.add_argument("--max-minutes", type=_minutes, metavar="M",
                   help="stop training after M minutes, keeping the best model so far")
    p.add_argument("--max-train-samples", type=int, metavar="N", help="train on a seeded random subset of N examples")
    p.add_argument("--max-eval-samples", type=int, metavar="N", help="validate on a seeded random subset of N examples")
    p.add_argument("--pooling", choices=("cls", "mean"), help="sentence vector: the pooled [CLS] or the mean of tokens")
    p.add_argument("--head-init", choices=("probe", "random"),
                   help="classifier start: a logistic-regression probe (LP-FT) or random")
    p.add_argument("--setfit-steps", type=_steps, metavar="N", help="steps of SetFit contrastive pairs before the head")
    p.add_argument("--self-train", type=_steps, metavar="K", help="self-training on K spans of each sentence (0: off)")
    p.add_argument("--self-distill", type=_self_distill, default=0.0, metavar="A",
                   help="self-distillation: A x the teacher's soft targets (default 0: off)")
    p.add_argument("--teacher", metavar="MODEL",
                   help="an LM teacher, e.g. smollm2 (full file at 2,000+); none: off")
    p.add_argument("--setfit-pairs", choices=("sampled", "all"), default="all",
                   help="every pair within a batch (default) or SetFit's sampled pairs")
    p.add_argument("--compile", action="store_true", help="torch.compile the training step (compiles first)")
    p.add_argument("--precision", choices=("fp32", "bf16", "auto"), default=None,
                   help="bf16 autocast, or auto: bf16 where it trains faster "
                        "(default: auto for sentence tasks from pretrained weights, else fp32)")
    p.add_argument("--layer-decay", type=_layer_decay, default=1.0, metavar="F",
                   help="each layer learns at F x the rate of the one above (default 1)")
    p.add_argument("--ema", type=_ema, metavar="D",
                   help="a weight average (EMA), decay D (off; full-file teacher: 0.999)")
    p.add_argument("--train-embeddings", action="store_true", help="also train the word embeddings (frozen unless full-file teacher)")
    p.add_argument("--from-scratch", action="store_true", help="--model's architecture with random weights")
    p.add_argument("--lora", metavar="SPEC", help="LoRA, e.g. r=8,alpha=16,dropout=0.05,targets=q+v")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    p.add_argument("--save-every", type=int, default=0, metavar="N",
                   help="write a checkpoint to OUTPUT/checkpoints every N steps")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --output")
    p.add_argument("--parallel", choices=("ddp", "fsdp"), default="ddp",
                   help="under torchrun: replicate (default) or shard the model")
    p.add_argument("--text-to-text", action="store_true", help="GLUE as T5 text-to-text (--model: a T5 preset/model)")
    t = p.add_argument_group("translation and text-to-text")
    t.add_argument("--src-lang", metavar="LANG", help="source language code, e.g. en")
    t.add_argument("--tgt-lang", metavar="LANG", help="target language code, e.g. de")
    t.add_argument("--directions", metavar="SRC-TGT,...", help="one multilingual model, e.g. en-de,de-en")
    for name in ("train-src", "train-tgt", "valid-src", "valid-tgt"):
        t.add_argument(f"--{name}", metavar="FILE", help="parallel text file, one sentence per line")
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a preset field (JSON value), e.g. hidden_size=256")
    t.add_argument("--vocab-size", type=int, default=8000, metavar="N", help="joint BPE vocabulary size (default 8000)")
    t.add_argument("--max-tokens", type=int, default=4096, metavar="N", help="padded tokens per batch (default 4096)")
    t.add_argument("--warmup", type=int, metavar="N", help="warmup steps of the inverse square-root schedule")
    t.add_argument("--lr-factor", type=float, default=1.0, metavar="F", help="multiplies the schedule (default 1.0)")
    t.add_argument("--eval-beams", type=int, default=1, metavar="N", help="beams when validating (default 1: greedy)")


def add_column_arguments(p: argparse.ArgumentParser) -> None:
    """The column options of the tasks that read the user's own files (evaluate and predict take them too)."""
    p.add_argument("--text-column", metavar="NAME", help="column or JSONL key of the text or tokens (default: found)")
    p.add_argument("--text-pair-column", metavar="NAME", help="column of a pair's second text (default: found)")
    p.add_argument("--label-column", metavar="NAME", help="column of the label, score or tags (default: found)")


def task_of(args: argparse.Namespace):
    """The task args name, reading the columns args give."""
    from ..tasks import get_task
    from ..tasks.user import with_columns
    return with_columns(get_task(args.task), getattr(args, "text_column", None),
                        getattr(args, "text_pair_column", None), getattr(args, "label_column", None))


def _steps(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value}: must be 0 (off) or more")
    return value


def _minutes(text: str) -> float:
    value = float(text)
    if not value > 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"{text}: must be more than 0 minutes")
    return value


def _unit_interval(*, zero: bool, one: bool, hint: str):
    """An argparse type for a number between 0 and 1, each end allowed or not (also refuses nan)."""
    span = f"{'[' if zero else '('}0, 1{']' if one else ')'}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a number in {span}, {hint}") from None
        if not ((0.0 <= value if zero else 0.0 < value) and (value <= 1.0 if one else value < 1.0)):
            raise argparse.ArgumentTypeError(f"{text}: must be in {span} ({hint})")
        return value
    return parse


_layer_decay = _unit_interval(zero=False, one=True, hint="1: the same rate for every layer; e.g. 0.8")
_ema = _unit_interval(zero=True, one=False, hint="0: off; e.g. 0.999")
_self_distill = _unit_interval(zero=True, one=False, hint="0: off; e.g. 0.5")


# Options each kind of run never reads, with their defaults: set to anything else they are refused, so a user
# never believes e.g. --warmup shaped an SST-2 run that ignored it.
_COLUMNS = {"text_column": None, "text_pair_column": None, "label_column": None}
_TRANSLATION_ONLY = {"src_lang": None, "tgt_lang": None, "directions": None, "train_src": None, "train_tgt": None,
                     "valid_src": None, "valid_tgt": None, "max_tokens": 4096, "warmup": None, "lr_factor": 1.0,
                     "eval_beams": 1}
_ENCODER_ONLY = {"test": None, "layer_decay": 1.0, "ema": None, "pooling": None, "head_init": None, "setfit_steps": None, "setfit_pairs": "all",
                 "self_train": None, "self_distill": 0.0, "teacher": None,
                 "compile": False, "precision": None, "train_embeddings": False, "from_scratch": False, "lora": None}
_NOT_READ = {
    "encoder": {**_TRANSLATION_ONLY, "set": [], "vocab_size": 8000},
    "text-to-text": {**_TRANSLATION_ONLY, **_ENCODER_ONLY, **_COLUMNS, "save_every": 0, "resume": False,
                     "parallel": "ddp"},
    "translation": {**_ENCODER_ONLY, **_COLUMNS, "train": None, "valid": None, "lr": None, "batch_size": None, "patience": None,
                    "max_train_samples": None, "text_to_text": False},
}


# What those runs do anyway: saying it is no error (text-to-text and translation train in fp32, nothing else).
_WHAT_RUNS = {"precision": "fp32"}


class UnreadOption(ValueError):
    exit_status = 2  # a usage error, like argparse's


def _refuse_unread(args: argparse.Namespace, kind: str) -> None:
    unread = [f"--{name.replace('_', '-')}" for name, default in _NOT_READ[kind].items()
              if getattr(args, name, default) not in (default, _WHAT_RUNS.get(name, default))]
    if unread:
        what = {"encoder": f"finetune {args.task}", "text-to-text": f"finetune {args.task} --text-to-text",
                "translation": "finetune translation"}[kind]
        raise UnreadOption(f"{what} does not read {', '.join(unread)}; remove "
                           f"{'it' if len(unread) == 1 else 'them'} (see finetune --help for what it takes)")


def run(args: argparse.Namespace) -> int:
    if args.save_every < 0:  # before any work (TrainArgs would refuse it only after the data is read)
        raise ValueError(f"--save-every {args.save_every}: must be 0 (no training checkpoints) or more")
    if args.task == "translation":
        if args.lora:
            raise ValueError("finetune translation: --lora is for the encoder tasks (and attnlab sft for decoders)")
        _refuse_unread(args, "translation")
        return _translation(args)
    if not args.model:
        raise ValueError(f"finetune {args.task}: --model is required")
    _refuse_unread(args, "text-to-text" if args.text_to_text else "encoder")
    if args.text_to_text:
        return _text_to_text(args)
    from ..tasks.finetune import finetune
    summary = finetune(task_of(args), args.model, args.output, options_of(args))
    _print_summary(summary)
    return 0


def _print_summary(summary: dict) -> None:
    """The JSON summary on stdout, once: under torchrun every process runs the recipe, and only the first
    (first_process) has the report-set scores."""
    from ..tasks.finetune_stages import first_process
    if first_process():
        print(json.dumps(summary))


# The flags are named as FinetuneOptions' fields, but for these (and --train-embeddings, --lora: see options_of)
_FIELD_FLAGS = {"train_file": "train", "valid_file": "valid", "test_file": "test"}


def options_of(args: argparse.Namespace):
    """The FinetuneOptions the flags give: each flag onto the field of its name; the rest keep their defaults."""
    from dataclasses import fields

    from ..tasks.finetune_options import FinetuneOptions
    given = {f.name: getattr(args, _FIELD_FLAGS.get(f.name, f.name)) for f in fields(FinetuneOptions)
             if hasattr(args, _FIELD_FLAGS.get(f.name, f.name))}
    # --train-embeddings says only "train them": left out, the recipe decides (frozen, but by the full-file teacher)
    given.update(freeze_embeddings=False if args.train_embeddings else None, lora=_lora(args.lora))
    return FinetuneOptions(**given)


def _text_to_text(args: argparse.Namespace) -> int:
    from ..tasks.text_to_text import finetune_text_to_text
    # a task or model text-to-text does not take raises TextToTextError: status 2 (cli.main), like a usage error
    summary = finetune_text_to_text(
        args.task, args.model, args.output, train_file=args.train, valid_file=args.valid,
        overrides=_overrides(args.set), epochs=args.epochs, lr=args.lr, batch_size=args.batch_size or 32,
        max_length=args.max_length or 128, max_minutes=args.max_minutes, max_train_samples=args.max_train_samples,
        max_eval_samples=args.max_eval_samples, seed=args.seed, vocab_size=args.vocab_size,
        eval_every=args.eval_every, patience=args.patience, progress=args.progress)
    _print_summary(summary)
    return 0


def _lora(spec: str | None) -> dict | None:
    from ..nn.lora import parse_lora_spec
    return parse_lora_spec(spec) if spec else None


def _translation(args: argparse.Namespace) -> int:
    from ..tasks.translation import finetune_translation
    if args.parallel != "ddp":
        raise ValueError("finetune translation: --parallel fsdp is not supported (its batches are not split "
                         "across processes); see docs/guides/distributed.md")
    missing = [f"--{n}" for n in ("train-src", "train-tgt", "valid-src", "valid-tgt") if not getattr(args, n.replace("-", "_"))]
    if missing:
        raise ValueError(f"finetune translation: {', '.join(missing)} required")
    if args.directions:  # a bad direction is a usage error (LanguageError: status 2), before any work
        from ..tasks.translation import parse_directions
        parse_directions(args.directions, args.src_lang or "", args.tgt_lang or "")
    overrides = _overrides(args.set)
    summary = finetune_translation(args.train_src, args.train_tgt, args.valid_src, args.valid_tgt, args.output,
                                   src_lang=args.src_lang or "src", tgt_lang=args.tgt_lang or "tgt",
                                   model=args.model or "transformer-base", overrides=overrides,
                                   vocab_size=args.vocab_size, max_tokens=args.max_tokens,
                                   max_length=args.max_length or 128, epochs=args.epochs or 30.0,
                                   max_minutes=args.max_minutes, warmup=args.warmup, lr_factor=args.lr_factor,
                                   eval_every=args.eval_every, eval_beams=args.eval_beams, seed=args.seed,
                                   max_eval_sentences=args.max_eval_samples, progress=args.progress,
                                   save_every=args.save_every, resume=args.resume, directions=args.directions)
    _print_summary(summary)
    return 0


def _overrides(items: list[str]) -> dict:
    """--set KEY=VALUE pairs: JSON values, else the text."""
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    return overrides
