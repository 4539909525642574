"""`make demo`: a tour of attnlab on bundled small data, offline, in a few minutes.

Each section shows one capability with a real model. Run it with `make demo`, or
`.venv/bin/python examples/demo.py` once `.venv` exists.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
MINILM = "sentence-transformers/all-MiniLM-L6-v2"  # resolved to the locally installed package, never downloaded


def section(title: str) -> None:
    print(f"\n{'=' * 100}\n{title}\n{'=' * 100}", flush=True)


def show_info() -> None:
    from attnlab.cli import main
    section(f"1. attnlab info {MINILM}: what the model is made of, one layer walked through")
    main(["info", MINILM, "--seq-len", "128"])


def nearest_neighbours() -> None:
    import attnlab
    from attnlab.inference.embed import embed, read_lines
    section("2. sentence embeddings with the real all-MiniLM-L6-v2 weights: nearest neighbours")
    model, tokenizer = attnlab.load(MINILM), attnlab.load_tokenizer(MINILM)
    corpus = read_lines(HERE / "data" / "sentences.txt")
    start = time.perf_counter()
    vectors = embed(model, tokenizer, corpus, batch_size=16)
    print(f"embedded {len(corpus)} sentences into {vectors.shape[1]}-d vectors in {time.perf_counter() - start:.2f}s")
    queries = ["My pet cat is sleeping.", "How do neural networks understand language?",
               "Prices dropped on Wall Street today."]
    qv = embed(model, tokenizer, queries)
    for query, scores in zip(queries, qv @ vectors.T):
        print(f"\nquery: {query}")
        for i in np.argsort(-scores)[:3]:
            print(f"  {scores[i]:.3f}  {corpus[i]}")


SECTIONS = [show_info, nearest_neighbours]


def main() -> int:
    start = time.perf_counter()
    for run in SECTIONS:
        run()
    print(f"\ndemo finished in {time.perf_counter() - start:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
