"""Shared helpers for the pretraining tests: a small real corpus and a small trained vocabulary, so
models stay tiny (vocab ~1000) and every test runs in seconds."""
from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from attnlab.config import ModelConfig


def sample_text(data_dir: Path, out: Path, chars_per_book: int = 40_000, books: int = 6) -> Path:
    """The opening (after the licence header) of a few Gutenberg books, each as its own file."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for book in sorted((data_dir / "gutenberg").glob("*.txt"))[:books]:
        text = book.read_text(encoding="utf-8-sig")
        start = text.find("*** START OF")
        body = text[text.index("\n", start) + 1:][:chars_per_book] if start >= 0 else text[:chars_per_book]
        path = out / book.name
        path.write_text(body, encoding="utf-8")
        paths.append(path)
    return out


def tiny_bert(vocab_size: int, **overrides) -> ModelConfig:
    values = dict(vocab_size=vocab_size, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                  max_position_embeddings=64)
    values.update(overrides)
    return ModelConfig(**values)


def tiny_gpt(vocab_size: int, **overrides) -> ModelConfig:
    values = dict(model_type="gpt2", vocab_size=vocab_size, hidden_size=32, num_layers=2, num_heads=2,
                  intermediate_size=64, max_position_embeddings=64, causal=True, norm_placement="pre",
                  embedding_norm=False, final_norm=True, pooler=False, type_vocab_size=0, pad_token_id=None,
                  activation="gelu_tanh", norm_eps=1e-5)
    values.update(overrides)
    return ModelConfig(**values)


@contextlib.contextmanager
def one_thread():
    """The machine is shared: a single intra-op thread is faster than two fighting other processes."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def train_losses(model, loss_fn, batches: list, steps: int, lr: float = 3e-3) -> tuple[list[float], dict]:
    """AdamW steps over `batches` in turn: the losses and the last step's sums (loss_fn -> (loss, sums))."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses, sums = [], {}
    for step in range(steps):
        loss, sums = loss_fn(model, batches[step % len(batches)])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, sums
