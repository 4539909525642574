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
OUT = HERE.parent / "out" / "demo"  # everything the demo writes (git-ignored)


def cli(argv: list[str]) -> None:
    """Run one `attnlab` command; a failing step fails the demo instead of scrolling past."""
    from attnlab.cli import main as attnlab
    if attnlab(argv) != 0:
        raise SystemExit(f"demo: `attnlab {' '.join(argv)}` failed")


def section(title: str) -> None:
    print(f"\n{'=' * 100}\n{title}\n{'=' * 100}", flush=True)


def show_info() -> None:
    section(f"1. attnlab info {MINILM}: what the model is made of, one layer walked through")
    cli(["info", MINILM, "--seq-len", "128"])


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


def attention_page() -> None:
    section("3. attention views: one self-contained HTML page (head, model and neuron views)")
    cli(["viz", MINILM, "--text", "The cat sat on the mat.", "--text-b", "It was happy.",
          "--output", str(OUT / "attention.html")])
    print(f"open {OUT / 'attention.html'} in any browser (works offline)")


def chat_with_smollm2() -> None:
    section("4. a real pretrained decoder: SmolLM2-135M-Instruct from its GGUF file, KV-cached greedy decoding")
    print("attnlab generate smollm2 --chat --prompt 'What is the capital of France?'\n")
    cli(["generate", "smollm2", "--chat", "--prompt", "What is the capital of France?", "--max-new-tokens", "24"])


def pretrain_char_gpt() -> None:
    section("5. pretraining from scratch: a character-level GPT on a bundled Shakespeare sample, then its curves")
    run = OUT / "gpt-char"
    cli(["pretrain", "--config", str(HERE.parent / "configs" / "pretrain-gpt-shakespeare-char.yaml"),
         f"data.files=[{HERE / 'data' / 'shakespeare-sample.txt'}]", f"data.path={OUT / 'corpus-char'}",
         "data.eval_batches=10", f"train.output_dir={run}", "train.max_steps=150", "train.warmup_steps=20",
         "train.eval_every=75", "train.log_every=25", "train.save_every=150"])
    cli(["plot", str(run)])
    print("\nsampling from the model trained a few seconds ago:")
    cli(["generate", str(run / "model"), "--prompt", "ROMEO:", "--max-new-tokens", "58",
         "--temperature", "0.8", "--seed", "0"])


SECTIONS = [show_info, nearest_neighbours, attention_page, chat_with_smollm2, pretrain_char_gpt]


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    for run in SECTIONS:
        run()
    print(f"\ndemo finished in {time.perf_counter() - start:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
