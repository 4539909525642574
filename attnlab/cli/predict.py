"""Predict with a fine-tuned model.

Input formats: classification (sst2, cola, mrpc, rte, stsb) takes plain text, one input per line, the
two sentences of a pair separated by a tab, and writes one label (or score) per line; conll2003 takes
one word per line (extra columns ignored), blank lines between sentences, and writes CoNLL `word TAG`
lines; squad takes SQuAD json and writes {question id: answer}.

example:
  attnlab predict sst2 --model out/sst2 --input reviews.txt --output labels.txt
"""
from __future__ import annotations

import argparse

NAME = "predict"
HELP = "predict labels / tags / answers for unlabelled inputs"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..tasks import TASK_NAMES
    p.add_argument("task", metavar="TASK", choices=TASK_NAMES, help=", ".join(TASK_NAMES))
    p.add_argument("--model", required=True, help="a fine-tuned model directory")
    p.add_argument("--input", required=True, help="inputs (see above for the format per task)")
    p.add_argument("--output", required=True, help="where to write the predictions")
    p.add_argument("--max-length", type=int, help="tokens per input (task default)")
    p.add_argument("--batch-size", type=int, default=64, help="inputs per batch (default 64)")


def run(args: argparse.Namespace) -> int:
    from ..tasks.finetune import predict
    from ..tasks.text_to_text import predict_text_to_text, saved_format
    if saved_format(args.model):  # trained by finetune --text-to-text: the label its generated string names
        predict = predict_text_to_text  # noqa: F811
    n = predict(args.task, args.model, args.input, args.output, max_length=args.max_length,
                batch_size=args.batch_size)
    print(f"wrote {n} predictions to {args.output}")
    return 0
