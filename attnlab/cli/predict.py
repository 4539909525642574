"""Predict with a fine-tuned model (`attnlab finetune`), writing one prediction per input.

Inputs: classification and regression take plain text, one input per line (a pair's two texts
separated by a tab), or a CSV / TSV / JSONL file with a header, as in training; they write one
label name (or score) per line. Token classification takes one word per line with blank lines
between sentences (or JSONL) and writes `word TAG` lines; question answering takes SQuAD json and
writes {question id: answer}.

examples:
  attnlab predict text-classification --model runs/reviews --input new.txt --output labels.txt
  attnlab predict sst2 --model runs/sst2 --input reviews.txt --output labels.txt
  attnlab predict conll2003 --model runs/ner --input words.txt --output tags.txt

Guide: docs/guides/fine-tuning.md
"""
from __future__ import annotations

import argparse

NAME = "predict"
HELP = "predict labels, tags or answers with a fine-tuned model"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .choices import TASKS as TASK_NAMES  # attnlab.tasks' names, without importing torch
    p.add_argument("task", metavar="TASK", choices=TASK_NAMES, help=", ".join(TASK_NAMES))
    p.add_argument("--model", required=True, help="a fine-tuned model directory")
    p.add_argument("--input", required=True, help="inputs (see above for the format per task)")
    p.add_argument("--output", required=True, help="where to write the predictions")
    p.add_argument("--max-length", type=int, help="tokens per input (task default)")
    p.add_argument("--batch-size", type=int, default=64, help="inputs per batch (default 64)")
    from .finetune import add_column_arguments
    add_column_arguments(p)


def run(args: argparse.Namespace) -> int:
    from ..tasks.finetune import predict
    from ..tasks.text_to_text import predict_text_to_text, saved_format
    if saved_format(args.model):  # trained by finetune --text-to-text: the label its generated string names
        predict = predict_text_to_text  # noqa: F811
    from .finetune import task_of
    task = args.task if saved_format(args.model) else task_of(args)
    n = predict(task, args.model, args.input, args.output, max_length=args.max_length,
                batch_size=args.batch_size)
    print(f"wrote {n} predictions to {args.output}")
    return 0
