"""Train a tokenizer on text files and write the files `load_tokenizer` (and transformers) read back.

  wordpiece  BERT: lower-cased, accents stripped, "##" sub-words; [PAD] [UNK] [CLS] [SEP] [MASK]
  bpe        GPT-2: byte-level BPE (never an unknown token), <|endoftext|>
  bart       BART / RoBERTa: the same byte-level BPE with <s> <pad> </s> <unk>, and <mask> last
  unigram    SentencePiece Unigram (Kudo 2018): "▁" starts a word; <unk> <s> </s> <pad> = ids 0-3
  char       one token per character seen (nanoGPT's shakespeare_char); --vocab-size is ignored

examples:
  attnlab tokenizer train --kind wordpiece --vocab-size 8000 --output runs/tok-wp books.txt
  attnlab tokenizer train --kind unigram --vocab-size 8000 --output runs/tok-spm train.en train.de
  attnlab tokenizer train --kind char --output runs/tok-char input.txt

Guide: docs/guides/pretraining-and-distillation.md (the files and special-token ids of each kind:
docs/guides/command-details.md)
"""
from __future__ import annotations

import argparse
from pathlib import Path

NAME = "tokenizer"
HELP = "train a WordPiece, BPE, Unigram or character tokenizer"


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    t = sub.add_parser("train", help="learn a vocabulary from FILES", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("files", nargs="+", type=Path, metavar="FILES", help="UTF-8 text files")
    t.add_argument("--kind", choices=("wordpiece", "bpe", "bart", "unigram", "char"), required=True)
    t.add_argument("--vocab-size", type=int, default=30522, help="target vocabulary size (default 30522)")
    t.add_argument("--output", type=Path, required=True, help="directory to write the tokenizer files into")
    t.add_argument("--min-frequency", type=int, default=2, help="ignore pieces seen fewer times (default 2)")
    t.add_argument("--cased", action="store_true", help="wordpiece: keep case and accents")
    t.add_argument("--debug", action="store_true", help="show full tracebacks on errors")


def run(args: argparse.Namespace) -> int:
    from ..tokenizers import train_tokenizer
    for f in args.files:
        if not f.is_file():
            raise FileNotFoundError(f"{f}: no such file")
    empty = [str(f) for f in args.files if f.stat().st_size == 0]
    if len(empty) == len(args.files):
        raise ValueError(f"all input files are empty: {', '.join(empty)}")
    tok = train_tokenizer(args.kind, args.files, args.vocab_size, lowercase=not args.cased,
                          min_frequency=args.min_frequency)
    tok.save(args.output)
    print(f"{args.kind} tokenizer with {tok.vocab_size} tokens written to {args.output}")
    return 0
