"""Score a fine-tuned model on a labelled file in the task's format; prints one JSON object.

example:
  attnlab evaluate conll2003 --model out/conll2003 --data ../shared/data/conll2003/valid.txt
"""
from __future__ import annotations

import argparse
import json

NAME = "evaluate"
HELP = "score a fine-tuned model on a labelled file (prints JSON metrics)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..tasks import TASK_NAMES
    p.add_argument("task", metavar="TASK", choices=TASK_NAMES, help=", ".join(TASK_NAMES))
    p.add_argument("--model", required=True, help="a fine-tuned model directory")
    p.add_argument("--data", required=True, help="labelled file (GLUE tsv, CoNLL, SQuAD json)")
    p.add_argument("--max-length", type=int, help="tokens per input (task default)")
    p.add_argument("--batch-size", type=int, default=64, help="inputs per batch (default 64)")


def run(args: argparse.Namespace) -> int:
    from ..tasks.finetune import evaluate
    print(json.dumps(evaluate(args.task, args.model, args.data, max_length=args.max_length,
                              batch_size=args.batch_size)))
    return 0
