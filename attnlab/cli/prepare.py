"""Tokenize text files into memory-mapped token shards for `attnlab pretrain`: documents -> sentences
-> token ids, with document and sentence boundaries and a held-out split. Memory stays flat
whatever the corpus size; the same command run again skips the shards already finished.

examples:
  attnlab prepare --tokenizer runs/tok-wp --output runs/corpus books.txt wiki.txt
  attnlab prepare --tokenizer char --raw --documents file --heldout 0.1 --output runs/c input.txt

Guide: docs/guides/pretraining-and-distillation.md (how documents are cut, invalid UTF-8:
docs/guides/command-details.md)
"""
from __future__ import annotations

import argparse
from pathlib import Path

NAME = "prepare"
HELP = "tokenize text files into token shards for pretraining"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", type=Path, metavar="FILES", help="UTF-8 text files")
    p.add_argument("--tokenizer", required=True,
                   help="tokenizer directory (vocab.txt / tokenizer.json / encoder.json+vocab.bpe), or 'char'")
    p.add_argument("--output", type=Path, required=True, help="directory for the shards")
    p.add_argument("--documents", choices=("auto", "blank-line", "file"), default="auto",
                   help="what ends a document (default auto; blank-line = BERT's one-sentence-per-line format)")
    p.add_argument("--raw", action="store_true", help="keep the text verbatim (newlines too); no sentence splitting")
    p.add_argument("--heldout", type=float, default=0.01, help="held-out fraction (default 0.01)")
    p.add_argument("--heldout-mode", choices=("documents", "tail"), default="documents",
                   help="hold out every 1/f-th document (default) or the last fraction of every document")
    p.add_argument("--shard-tokens", type=int, default=1_000_000, metavar="N",
                   help="tokens per shard (default 1,000,000)")
    p.add_argument("--on-bad-utf8", choices=("skip", "error"), default="skip",
                   help="invalid UTF-8 lines: skip and count them (default), or stop with file and byte offset")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    import sys

    from ..data.shards import prepare_corpus
    from ..tokenizers import build_char_tokenizer, load_tokenizer
    tokenizer = build_char_tokenizer(args.files) if args.tokenizer == "char" else load_tokenizer(args.tokenizer)
    stats = prepare_corpus(tokenizer, args.files, args.output, documents=args.documents, raw=args.raw,
                           heldout=args.heldout, heldout_mode=args.heldout_mode, shard_tokens=args.shard_tokens,
                           on_bad_utf8=args.on_bad_utf8, progress=args.progress, tokenizer_source=args.tokenizer)
    print(f"{stats.documents} documents -> {stats.train_tokens:,} train + {stats.heldout_tokens:,} held-out tokens "
          f"in {stats.shards} shard(s) ({stats.reused_shards} reused) at {args.output}")
    if stats.skipped_lines:
        print(f"skipped {stats.skipped_lines} line(s) that are not valid UTF-8", file=sys.stderr)
    return 0
