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
    p.add_argument("task", metavar="TASK", choices=(*TASK_NAMES, "translation"), help=", ".join((*TASK_NAMES, "translation")))
    p.add_argument("--model", required=True, help="a fine-tuned model directory")
    p.add_argument("--data", help="labelled file (GLUE tsv, CoNLL, SQuAD json)")
    p.add_argument("--source", help="translation: source sentences, one per line")
    p.add_argument("--reference", help="translation: reference translations, line-aligned with --source")
    p.add_argument("--num-beams", type=int, default=4, help="translation: beam size (default 4)")
    p.add_argument("--max-length", type=int, help="tokens per input (task default)")
    p.add_argument("--batch-size", type=int, default=64, help="inputs per batch (default 64)")


def run(args: argparse.Namespace) -> int:
    if args.task == "translation":  # sacreBLEU on detokenized output
        if not args.source or not args.reference:
            raise ValueError("evaluate translation: --source and --reference are required")
        from ..tasks.translation import evaluate_translation
        print(json.dumps(evaluate_translation(args.model, args.source, args.reference, num_beams=args.num_beams,
                                              max_length=args.max_length or 256)))
        return 0
    if not args.data:
        raise ValueError(f"evaluate {args.task}: --data is required")
    from ..tasks.finetune import evaluate
    print(json.dumps(evaluate(args.task, args.model, args.data, max_length=args.max_length,
                              batch_size=args.batch_size)))
    return 0
