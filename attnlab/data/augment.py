"""Augmented copies of training sentences, for distillation: the student learns a teacher's answers on more
inputs than the labeled file holds.

TinyBERT (Jiao et al. 2020, §3.2) relabels word-substituted copies of the task data with the teacher; Beyer et
al. (2022) show that the teacher must see the same augmented input as the student ("consistent teaching"), so
a copy is meant to be labeled again by the teacher, never to keep its source's label blindly. The operations
are EDA's (Wei & Zou 2019), which need no extra model: word deletion, swaps of word pairs, a random contiguous
span, and word replacement drawn from the sentences' own word frequencies.
"""
from __future__ import annotations

import random
from collections import Counter
from typing import Sequence

DELETE_P = 0.15    # EDA's p for random deletion
REPLACE_SHARE = 0.15


def edit(words: list[str], rng: random.Random, vocab: list[str], weights: list[int]) -> list[str]:
    """One EDA operation, drawn at random, on a sentence of at least 2 words."""
    n = len(words)
    op = rng.choice((0, 1, 2, 3) if n >= 4 else (0, 1, 3))  # a span needs at least 4 words to differ
    if op == 0:                                    # delete each word with p = DELETE_P, at least one
        keep = [w for w in words if rng.random() >= DELETE_P]
        if len(keep) == n:
            keep.pop(rng.randrange(n))
        return keep if len(keep) >= 2 else words[:2]
    if op == 1:                                    # swap 1 + n // 8 pairs
        out = list(words)
        for _ in range(1 + n // 8):
            i, j = rng.randrange(n), rng.randrange(n)
            out[i], out[j] = out[j], out[i]
        return out
    if op == 2:                                    # a contiguous span of at least half the words
        length = rng.randint(max(3, n // 2), n - 1)
        start = rng.randint(0, n - length)
        return words[start:start + length]
    out = list(words)                              # replace REPLACE_SHARE of the words, at least one
    for i in rng.sample(range(n), max(1, round(REPLACE_SHARE * n))):
        out[i] = rng.choices(vocab, weights)[0]
    return out


def augmented_copies(texts: Sequence[str], copies: int, *, copies_long: int = 15, min_words: int = 4,
                     seed: int = 0) -> list[tuple[int, str]]:
    """(index of the source sentence, copy) for `copies` edited copies of each sentence of at least `min_words`
    words (whitespace words; one more copy for sentences of at least `copies_long`). No copy equals a source
    sentence or another copy (five draws each; a sentence that gives no new one gets fewer copies)."""
    if min_words < 2:
        raise ValueError(f"augmented_copies: min_words={min_words} must be at least 2 (the edits keep 2 words)")
    rng = random.Random(seed)
    counts = Counter(w for s in texts for w in s.split())
    vocab, weights = list(counts), list(counts.values())
    seen = set(texts)
    out = []
    for k, s in enumerate(texts):
        words = s.split()
        if len(words) < min_words:
            continue
        for _ in range(copies + (len(words) >= copies_long)):
            for _try in range(5):                  # a copy equal to a seen line teaches nothing new
                t = " ".join(edit(words, rng, vocab, weights))
                if t not in seen:
                    seen.add(t)
                    out.append((k, t))
                    break
    return out
