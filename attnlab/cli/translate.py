"""Translate a text file, one sentence per line, with an encoder-decoder: a model trained by `attnlab
finetune translation`, or a T5 checkpoint with its tokenizer. Empty lines stay empty; lines over
--max-length tokens are truncated, with one warning that counts them.

examples:
  attnlab translate runs/en-de --input val.en --output val.hyp.de --num-beams 4
  attnlab translate runs/en-de-en --input val.de --output val.hyp.en --target-lang en

Guide: docs/guides/command-details.md (translate)
"""
from __future__ import annotations

import argparse
import sys

NAME = "translate"
HELP = "translate a file line by line with an encoder-decoder"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="model directory (config.json, model.safetensors, tokenizer.json)")
    p.add_argument("--input", required=True, help="source text, one sentence per line")
    p.add_argument("--output", required=True, help="where to write the translations (same number of lines)")
    p.add_argument("--num-beams", type=int, default=4, help="beam size (default 4; 1 = greedy)")
    p.add_argument("--max-length", type=int, default=256, help="source tokens kept per line (default 256)")
    p.add_argument("--target-lang", help="a multilingual model (finetune translation --directions): the language "
                                          "to write, e.g. de; its __de__ token is forced first")
    p.add_argument("--source-lang", help="a multilingual model: the input's language (default: the model's other one)")


def run(args: argparse.Namespace) -> int:
    import warnings
    from ..tasks.translation import translate_file  # LanguageError: a usage error, status 2 (cli.main)
    with warnings.catch_warnings(record=True) as caught:  # each warning (truncation, empty lines) as one line
        warnings.simplefilter("always")
        n = translate_file(args.model, args.input, args.output, num_beams=args.num_beams,
                           max_length=args.max_length, src_lang=args.source_lang, tgt_lang=args.target_lang)
    for w in caught:
        print(f"attnlab translate: warning: {w.message}", file=sys.stderr)
    print(f"translated {n} lines into {args.output}", file=sys.stderr)
    return 0
