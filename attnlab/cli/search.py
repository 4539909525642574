"""Query a retrieval index built by `attnlab index`: the k best passages for a query, or, with
--squad, the question -> paragraph recall@1/5/20 and per-query latency over a SQuAD-format file.

The query is encoded by the index's model (from meta.json; --model overrides) the way the index
was built: dense = cosine of mean-pooled vectors, colbert = MaxSim over the passage's tokens.

examples:
  attnlab search idx/ "When did the Normans conquer England?" -k 5
  attnlab search idx-colbert/ --squad squad-dev.json --limit 200

Guide: docs/guides/embeddings.md
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

NAME = "search"
HELP = "query a retrieval index; --squad scores recall@k"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("index", metavar="INDEX", type=Path, help="index directory written by `attnlab index`")
    p.add_argument("query", metavar="QUERY", nargs="?", help="the question or query text")
    p.add_argument("-k", type=int, default=5, help="passages to show (default 5)")
    p.add_argument("--model", help="encoder for the queries (default: the index's model, from meta.json)")
    p.add_argument("--squad", type=Path, help="SQuAD-format .json: score every question against the index "
                                              "(built from the same file) and print recall@1/5/20 and latency")
    p.add_argument("--limit", type=int, help="--squad: score only the first N questions")
    p.add_argument("--max-length", type=int, default=64, help="tokens per query (default 64)")


def _fail(args, err) -> int:
    if args.debug:
        raise err
    print(f"attnlab search: error: {err}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    import attnlab
    from ..inference.retrieval import index_bytes, load_index, search
    from ..tasks.retrieval import evaluate_retrieval, gold_in_index, squad_pairs
    if (args.query is None) == (args.squad is None):
        return _fail(args, ValueError("give either QUERY or --squad FILE"))
    if args.k <= 0:
        return _fail(args, ValueError(f"-k must be positive, got {args.k}"))
    try:
        index = load_index(args.index)
        if args.squad is not None:
            paragraphs, questions, gold = squad_pairs(args.squad)
            gold = gold_in_index(index, paragraphs, gold, str(args.squad))
    except ValueError as err:  # not an index, or a SQuAD file that does not match it
        return _fail(args, err)
    model_name = args.model or index.meta.get("model")
    if not model_name:
        return _fail(args, ValueError(f"{args.index}/meta.json names no model; pass --model"))
    model = attnlab.load(model_name)
    tokenizer = attnlab.load_tokenizer(model_name)
    if args.squad is not None:
        result = evaluate_retrieval(index, model, tokenizer, questions, gold, max_length=args.max_length,
                                    limit=args.limit)
        result.update({"index": str(args.index), "index_bytes": index_bytes(args.index), "model": str(model_name)})
        print(json.dumps(result))
        return 0
    for rank, (i, score) in enumerate(search(index, model, tokenizer, [args.query], args.k,
                                             max_length=args.max_length)[0], 1):
        text = index.passages[i]
        print(f"{rank}\t{score:.4f}\t#{i}\t{text if len(text) <= 200 else text[:197] + '...'}")
    return 0
