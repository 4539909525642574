"""Zero- and few-shot classification by prompting (Brown et al. 2020, §2): no weight changes; the model
reads k labelled demonstrations and the test input, and the label whose words it finds most probable
next wins.

    Review: a gorgeous, witty film.            <- k demonstrations (drawn with a seed from a training pool)
    Sentiment: positive

    Review: the plot is a mess.                <- the test input
    Sentiment:                                 <- score log p(" positive") vs log p(" negative")

The score of a label is the sum of its tokens' log-probabilities after the prompt, so multi-token label
words are compared fairly by their whole text.
"""
from __future__ import annotations

import random
import time
from typing import Sequence

import torch

from ..inference.kv_cache import KVCache


def kshot_prompt(demos: Sequence[tuple[str, str]], text: str, template: str = "Review: {text}\nSentiment:") -> str:
    """The demonstrations (text, label word), each followed by a blank line, then the test input."""
    shots = "".join(template.format(text=t) + f" {label}\n\n" for t, label in demos)
    return shots + template.format(text=text)


def draw_demos(pool: Sequence[tuple[str, str]], k: int, seed: int) -> list[tuple[str, str]]:
    if k > len(pool):
        raise ValueError(f"{k} demonstrations asked for, the pool has {len(pool)}")
    return random.Random(seed).sample(list(pool), k)


def label_scores(model, tokenizer, prompts: Sequence[str], label_words: Sequence[str], batch_size: int = 16,
                 pad_id: int = 0) -> torch.Tensor:
    """(len(prompts), len(label_words)): log p(" word" | prompt) for every prompt and label word, with the
    prompt and the word tokenized apart (as `answer_example` does).

    Affordable for many prompts that share demonstrations: the tokens every prompt starts with (the k
    demonstrations and "Review:") run once, batch 1, into a KV cache that each batch of prompts continues
    from (copied per row); and the label words are scored from the same forward pass: a row holds a prompt's
    own tokens plus a label's tokens but its last, so single-token label words (" positive", " negative")
    all read their log-probability off one row's last position. Rows are left-padded, so every row's
    last positions line up and only they go through the vocabulary projection; batches hold rows of similar
    length."""
    rows = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    labels = [tokenizer.encode(" " + w, add_special_tokens=False) for w in label_words]
    if any(not r for r in rows) or any(not w for w in labels):
        raise ValueError("a prompt or label word encodes to no tokens")
    heads = sorted({tuple(w[:-1]) for w in labels})      # labels that differ only in their last token share a row
    keep = max(len(w) for w in labels)                   # positions whose next-token log-probabilities are read
    shared = _shared_length(rows) if model.config.attention_kind != "linear" else 0
    prefix = _prefix_cache(model, rows[0][:shared]) if shared else None
    # rows of similar length batch together: left padding to the longest row of a batch is wasted work
    jobs = sorted(((i, h) for i in range(len(rows)) for h in heads), key=lambda j: len(rows[j[0]]) + len(j[1]))
    out = torch.empty(len(rows), len(labels))
    for start in range(0, len(jobs), batch_size):
        chunk = jobs[start:start + batch_size]
        tails = [rows[i][shared:] + list(h) for i, h in chunk]
        width = max(len(t) for t in tails)
        ids = torch.full((len(tails), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(tails), shared + width), dtype=torch.long)
        mask[:, :shared] = 1
        for r, t in enumerate(tails):
            ids[r, width - len(t):] = torch.tensor(t)
            mask[r, shared + width - len(t):] = 1
        cache = _continue(model, prefix, len(tails), shared + width) if prefix else None
        with torch.no_grad():
            logits = model(ids, attention_mask=None if bool(mask.all()) else mask, past_key_values=cache,
                           use_cache=cache is not None, logits_to_keep=keep).logits.float().log_softmax(-1)
        for r, (i, h) in enumerate(chunk):
            for j, w in enumerate(labels):
                if tuple(w[:-1]) == h:   # token w[t] is predicted at position keep - len(w) + t of the kept ones
                    out[i, j] = sum(logits[r, keep - len(w) + t, tok] for t, tok in enumerate(w))
    return out


def _shared_length(rows: Sequence[Sequence[int]]) -> int:
    """Tokens every row starts with, leaving each row at least one token of its own."""
    n = min(len(r) for r in rows) - 1
    first = rows[0]
    for r in rows[1:]:
        n = next((t for t in range(n) if r[t] != first[t]), n)
    return n


def _prefix_cache(model, ids: list[int]) -> KVCache:
    cache = KVCache.for_model(model)
    with torch.no_grad():
        model(torch.tensor([ids]), past_key_values=cache, use_cache=True, logits_to_keep=1)
    return cache


def _continue(model, prefix: KVCache, batch: int, max_length: int) -> KVCache:
    """A fresh cache for `batch` rows, each starting from a copy of the prefix's keys/values."""
    cache = KVCache.for_model(model, max_length=max_length)
    for layer in range(prefix.num_layers):
        k, v = prefix.keys[layer], prefix.values[layer]
        n = k.size(2) if prefix.windows[layer] is not None else prefix.lengths[layer]
        cache.update(layer, k[:, :, :n].expand(batch, -1, -1, -1), v[:, :, :n].expand(batch, -1, -1, -1))
        cache.lengths[layer] = prefix.lengths[layer]
    return cache


def evaluate_prompting(model, tokenizer, test: Sequence[tuple[str, str]], pool: Sequence[tuple[str, str]],
                       shots: Sequence[int] = (0, 1, 4, 8), label_words: Sequence[str] = ("negative", "positive"),
                       seed: int = 0, batch_size: int = 16) -> dict[int, dict]:
    """Accuracy for each k in `shots`. `test` and `pool` hold (text, label word); one draw of demonstrations
    (seeded) serves every test input of a k."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    gold = torch.tensor([list(label_words).index(y) for _, y in test])
    results = {}
    for k in shots:
        demos = draw_demos(pool, k, seed + k)
        wall, cpu = time.perf_counter(), time.process_time()
        scores = label_scores(model, tokenizer, [kshot_prompt(demos, t) for t, _ in test], label_words, batch_size, pad)
        pred = scores.argmax(-1)
        results[k] = {"accuracy": round(100 * (pred == gold).float().mean().item(), 1),
                      "predicted_share": {w: round((pred == i).float().mean().item(), 3) for i, w in enumerate(label_words)},
                      "seconds": round(time.perf_counter() - wall, 1), "cpu_seconds": round(time.process_time() - cpu, 1)}
    return results
