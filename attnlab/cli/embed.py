"""Embed text: one vector per input line, written as a float32 .npy array of shape (lines, hidden).
Vectors are the mean of the last hidden states over real tokens (or the [CLS] vector),
L2-normalised unless --no-normalize, so a dot product is a cosine similarity.

examples:
  attnlab embed minilm --input sentences.txt --output vectors.npy
  attnlab embed minilm --input sentences.txt --output vectors.npy --dtype auto
  attnlab embed minilm --input sentences.txt --output raw.npy --pooling cls --no-normalize

Guide: docs/guides/embeddings.md
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

NAME = "embed"
HELP = "embed each line of a text file into one vector (.npy)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="an encoder model directory or packaged name")
    p.add_argument("--input", required=True, type=Path, help="UTF-8 text file, one input per line")
    p.add_argument("--output", required=True, type=Path, help="where to write the .npy array")
    p.add_argument("--pooling", choices=("mean", "cls"), default="mean", help="how to pool tokens (default mean)")
    p.add_argument("--batch-size", type=int, default=32, help="sentences per batch (default 32)")
    p.add_argument("--max-length", type=int, default=None, help="truncate inputs to this many tokens "
                                                                 "(default: the model's maximum)")
    p.add_argument("--dtype", choices=("fp32", "bf16", "int8", "auto"), default="fp32",
                   help="precision of the linear layers: int8 (per-token, SmoothQuant; fast with VNNI, AMX or "
                        "AVX2), bf16 (fast with AMX; may be slower on AVX512-BF16 alone), fp32 (default), or auto: the fastest of "
                        "them whose embeddings of the bundled calibration sentences keep cosine min 0.99 / "
                        "mean 0.998 to fp32 on this CPU (measured at load)")
    p.add_argument("--no-normalize", dest="normalize", action="store_false", help="keep raw (unnormalised) vectors")


def run(args: argparse.Namespace) -> int:
    import numpy as np

    import attnlab
    from ..interop.files import atomic_write
    from ..inference.embed import embed, read_lines
    texts = read_lines(args.input)
    from ..inference.quantize import COSINE_BAR, auto_precision, calibration_batches, quantize
    model = attnlab.load(args.model, architecture=None)
    tokenizer = attnlab.load_tokenizer(args.model)
    if args.dtype == "auto":
        model, args.dtype, checks = auto_precision(model, tokenizer, pooling=args.pooling)
        tried = "; ".join(f"{c['dtype']} {c['min']:.4f} / {c['mean']:.4f}{'' if c['kept'] else ' (missed)'}"
                          for c in checks)
        print(f"embed: --dtype auto: {args.dtype} on this CPU" + (
            f" (cosine to fp32 on the calibration sentences, min / mean, bar {COSINE_BAR[0]} / {COSINE_BAR[1]}: "
            f"{tried})" if checks else ""), file=sys.stderr)
    elif args.dtype != "fp32":
        model = quantize(model, args.dtype, inplace=True,
                         calibration=calibration_batches(tokenizer) if args.dtype == "int8" else None)
    vectors = embed(model, tokenizer, texts, pooling=args.pooling, normalize=args.normalize,
                    batch_size=args.batch_size, max_length=args.max_length)
    out = args.output if args.output.suffix == ".npy" else args.output.with_name(args.output.name + ".npy")
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, lambda tmp: np.save(open(tmp, "wb"), vectors))
    print(f"wrote {vectors.shape[0]} vectors of size {vectors.shape[1]} to {out}")
    return 0
