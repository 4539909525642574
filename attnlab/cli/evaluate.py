"""Score a fine-tuned model on a labelled file in its task's format, or (TASK lm) a language model's
perplexity, bits per byte and word perplexity on any text; prints one JSON object. A .gguf model
keeps its Q4_0/Q4_1/Q8_0 weights quantized unless --dequantize. Text `evaluate lm` cannot score
(empty, invalid UTF-8, under two tokens, no LM head) exits with status 2.

examples:
  attnlab evaluate sst2 --model runs/sst2 --data held-out.tsv
  attnlab evaluate text-classification --model runs/reviews --data test.csv
  attnlab evaluate lm --model smollm2 --data valid.txt --context 512
  attnlab evaluate translation --model runs/en-de --source val.en --reference val.de

Guide: docs/guides/fine-tuning.md (perplexity conventions, --dtype:
docs/guides/command-details.md)
"""
from __future__ import annotations

import argparse
import json
import sys

NAME = "evaluate"
HELP = "score a fine-tuned model on labelled data, or an LM's perplexity"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .choices import TASKS as TASK_NAMES  # attnlab.tasks' names, without importing torch
    tasks = (*TASK_NAMES, "translation", "lm")
    p.add_argument("task", metavar="TASK", choices=tasks, help=", ".join(tasks))
    p.add_argument("--model", required=True, help="a fine-tuned model directory")
    p.add_argument("--data", help="labelled file (GLUE tsv, CoNLL, SQuAD json)")
    from .finetune import add_column_arguments
    add_column_arguments(p)
    p.add_argument("--source", help="translation: source sentences, one per line")
    p.add_argument("--reference", help="translation: reference translations, line-aligned with --source")
    p.add_argument("--num-beams", type=int, default=4, help="translation: beam size (default 4)")
    p.add_argument("--target-lang", help="translation, multilingual model: the direction's target language, e.g. de")
    p.add_argument("--source-lang", help="translation, multilingual model: the source language (default: the other one)")
    p.add_argument("--max-length", type=int, help="tokens per input (task default)")
    p.add_argument("--batch-size", type=int, help="inputs per batch (default 64; lm: 4 windows, or 32 masked copies for a masked LM)")
    p.add_argument("--context", type=int, help="lm: tokens per window (default the model's maximum, at most 1024)")
    p.add_argument("--stride", type=int, help="lm, hf convention: tokens between window starts (default context/2)")
    p.add_argument("--convention", choices=("hf", "llama.cpp"), default="hf",
                   help="lm: hf = transformers' sliding window (default); llama.cpp = llama-perplexity's chunks")
    p.add_argument("--dtype", choices=("fp32", "bf16", "int8"), default="fp32",
                   help="precision: fp32 (default), bf16 (fast with AMX; may be slower on AVX512-BF16 alone), "
                        "int8 for a fine-tuned model (per-token, SmoothQuant; fast with VNNI, AMX or AVX2)")
    p.add_argument("--dequantize", action="store_true",
                   help="lm, .gguf: dequantize the weights to fp32 (default: they stay quantized; the same "
                        "perplexity to rounding)")


def run(args: argparse.Namespace) -> int:
    if args.task == "lm":
        return _run_lm(args)
    if args.dtype != "fp32" and args.task == "translation":
        raise ValueError("evaluate translation: --dtype is not supported (it runs in fp32)")
    if args.task == "translation":  # sacreBLEU on detokenized output
        if not args.source or not args.reference:
            raise ValueError("evaluate translation: --source and --reference are required")
        from ..tasks.translation import evaluate_translation  # LanguageError: a usage error, status 2
        print(json.dumps(evaluate_translation(args.model, args.source, args.reference, num_beams=args.num_beams,
                                              max_length=args.max_length or 256, src_lang=args.source_lang,
                                              tgt_lang=args.target_lang)))
        return 0
    if not args.data:
        raise ValueError(f"evaluate {args.task}: --data is required")
    from ..tasks.text_to_text import evaluate_text_to_text, saved_format
    if saved_format(args.model):  # trained by finetune --text-to-text: scored on its generated label words
        if args.dtype != "fp32":
            raise ValueError(f"evaluate {args.task}: --dtype is not supported for a text-to-text model (fp32)")
        print(json.dumps(evaluate_text_to_text(args.task, args.model, args.data, max_length=args.max_length or 128,
                                               batch_size=args.batch_size or 64)))
        return 0
    from ..tasks.finetune import evaluate
    from .finetune import task_of
    print(json.dumps(evaluate(task_of(args), args.model, args.data, max_length=args.max_length,
                              batch_size=args.batch_size or 64, dtype=args.dtype)))
    return 0


def _run_lm(args: argparse.Namespace) -> int:
    from ..tasks.lm import evaluate_lm  # LMInputError (text it cannot score): status 2, like a usage error
    if not args.data:
        raise ValueError("evaluate lm: --data is required (a UTF-8 text file)")
    if args.dtype == "int8":
        raise ValueError("evaluate lm: --dtype int8 is for fine-tuned models; a language model takes fp32 or bf16 "
                         "(a .gguf keeps its own quantized weights)")
    result = evaluate_lm(args.model, args.data, context=args.context, stride=args.stride,
                         batch_size=args.batch_size, convention=args.convention, progress=True,
                         dtype=args.dtype, dequantize=args.dequantize, note=lambda line: print(line, file=sys.stderr))
    print(json.dumps(result))
    return 0
