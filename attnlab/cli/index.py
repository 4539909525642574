"""Build a retrieval index over passages with an encoder: one vector per passage (--kind dense,
DPR-style, mean-pooled and normalised) or one vector per passage token (--kind colbert, scored by
MaxSim).

PASSAGES is a UTF-8 text file, one passage per line (blank lines are skipped), or a SQuAD-format
.json file, whose paragraphs become the passages. The index is a directory (vectors.npy,
offsets.npy, passages.jsonl, meta.json); `attnlab search` queries it.

examples:
  attnlab index passages.txt --model minilm --output idx/
  attnlab index squad-dev.json --model minilm --kind colbert --output idx-colbert/
  attnlab search idx/ "Who wrote Hamlet?" -k 5

Guide: docs/guides/embeddings.md
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

NAME = "index"
HELP = "build a dense or ColBERT-style retrieval index over passages"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("passages", metavar="PASSAGES", type=Path,
                   help="text file, one passage per line, or SQuAD .json (its paragraphs)")
    p.add_argument("--model", required=True, help="encoder model directory or packaged name (e.g. minilm)")
    p.add_argument("--output", required=True, type=Path, help="index directory to write (replaced if present)")
    p.add_argument("--kind", choices=("dense", "colbert"), default="dense",
                   help="dense: one mean-pooled vector per passage; colbert: one vector per token (default dense)")
    p.add_argument("--max-length", type=int, default=256, help="tokens per passage, longer ones are cut (default 256)")
    p.add_argument("--batch-size", type=int, default=32, help="passages per encoder batch (default 32)")
    p.add_argument("--dtype", choices=("float32", "float16"), default="float32",
                   help="stored vector precision; float16 halves the index, scoring stays float32 (default float32)")


def read_passages(path: Path) -> tuple[list[str], int]:
    """(passages, blank lines skipped); a SQuAD .json gives its paragraphs."""
    from ..inference.embed import read_lines
    from ..tasks.retrieval import squad_pairs
    if path.suffix.lower() == ".json":
        return squad_pairs(path)[0], 0
    lines = read_lines(path)
    passages = [line for line in lines if line.strip()]
    if not passages:
        raise ValueError(f"{path}: no passages (the file is empty or only blank lines)")
    return passages, len(lines) - len(passages)


def run(args: argparse.Namespace) -> int:
    import attnlab
    from ..inference.retrieval import build_index, index_bytes, save_index
    try:
        passages, skipped = read_passages(args.passages)
    except ValueError as err:  # input that cannot be indexed: status 2, like argparse's usage errors
        if args.debug:
            raise
        print(f"attnlab index: error: {err}", file=sys.stderr)
        return 2
    if skipped:
        print(f"attnlab index: skipped {skipped} blank lines of {args.passages}", file=sys.stderr)
    model = attnlab.load(args.model)
    tokenizer = attnlab.load_tokenizer(args.model)
    name = str(Path(args.model).resolve()) if Path(args.model).exists() else args.model
    index = build_index(model, tokenizer, passages, args.kind, model_name=name, max_length=args.max_length,
                        batch_size=args.batch_size, dtype=args.dtype)
    out = save_index(index, args.output)
    print(f"indexed {len(passages)} passages ({index.vectors.shape[0]} vectors of {index.vectors.shape[1]}, "
          f"{args.kind}, {args.dtype}) into {out}: {index_bytes(out):,} bytes")
    return 0
