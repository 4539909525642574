"""T5's span corruption (Raffel et al. 2020, §3.1.4 and §3.3.4): drop 15% of the tokens in spans of mean
length 3; each dropped span becomes one sentinel in the input, and the target spells out the dropped
spans, each behind its sentinel.

Worked example (noise rate 0.3, mean span 2, so 3 of 10 tokens in round(3 / 2) = 2 spans):
    tokens   Thank you for inviting me to your party last week
    noise                  ^^^^^^^^^^^^                ^^^^       spans "for inviting", "last"
    input    Thank you <X> me to your party <Y> week </s>
    target   <X> for inviting <Y> last <Z> </s>

Which tokens are noise is decided as T5 does (`random_spans_noise_mask`): the counts are fixed by the
length (round(L * rate) noise tokens in round(noise / mean_span) spans), and the tokens are cut into
that many non-empty noise and non-noise spans uniformly at random, alternating, non-noise first. Span
lengths then average `mean_span` exactly, and the rate holds for every sequence, not only on average.
Sentinels are T5's <extra_id_0>, <extra_id_1>, ...: ids vocab_size - 1, vocab_size - 2, ... by default.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

IGNORE = -100


def _segments(n_items: int, n_segments: int, rng: np.random.Generator) -> np.ndarray:
    """Lengths of a uniformly random cut of n_items into n_segments non-empty segments."""
    starts = np.zeros(n_items, dtype=np.int64)
    starts[rng.choice(np.arange(1, n_items), size=n_segments - 1, replace=False)] = 1
    segment_id = np.cumsum(starts)
    return np.bincount(segment_id, minlength=n_segments)


def random_spans_noise_mask(length: int, rng: np.random.Generator, rate: float = 0.15,
                            mean_span: float = 3.0) -> np.ndarray:
    """Bool array of `length`: True where a token is dropped (noise)."""
    if length < 2:
        return np.zeros(length, dtype=bool)
    n_noise = int(min(max(round(length * rate), 1), length - 1))
    n_spans = int(max(round(n_noise / mean_span), 1))
    n_spans = min(n_spans, n_noise, length - n_noise)
    noise_lengths = _segments(n_noise, n_spans, rng)
    keep_lengths = _segments(length - n_noise, n_spans, rng)
    mask = np.zeros(length, dtype=bool)
    pos = 0
    for keep, noise in zip(keep_lengths, noise_lengths):  # non-noise span first, then a noise span
        pos += keep
        mask[pos:pos + noise] = True
        pos += noise
    return mask


def _replace_spans(ids: np.ndarray, drop: np.ndarray, sentinels: Sequence[int]) -> list[int]:
    """Keep ids where not `drop`; each run of dropped ids becomes the next sentinel."""
    out, k = [], 0
    for i in range(len(ids)):
        if drop[i]:
            if i == 0 or not drop[i - 1]:
                out.append(sentinels[k])
                k += 1
        else:
            out.append(int(ids[i]))
    return out


def corrupt(ids: Sequence[int], rng: np.random.Generator, sentinels: Sequence[int], rate: float = 0.15,
            mean_span: float = 3.0, eos_id: int | None = None) -> tuple[list[int], list[int]]:
    """(input ids, target ids) for one sequence, as in the module docstring; `eos_id` is appended to both."""
    ids = np.asarray(ids, dtype=np.int64)
    noise = random_spans_noise_mask(len(ids), rng, rate, mean_span)
    needed = int(np.sum(noise & ~np.r_[False, noise[:-1]])) + 1
    if needed > len(sentinels):
        raise ValueError(f"span corruption needs {needed} sentinels for {len(ids)} tokens; got {len(sentinels)}")
    inputs = _replace_spans(ids, noise, sentinels)
    targets = _replace_spans(ids, ~noise, sentinels)  # the complement: kept text becomes the sentinels
    if eos_id is not None:
        inputs.append(eos_id)
        targets.append(eos_id)
    return inputs, targets


def t5_sentinels(vocab_size: int, count: int = 100) -> list[int]:
    """T5's <extra_id_0 .. count-1>: the last `count` ids of the vocabulary, counting down."""
    return [vocab_size - 1 - i for i in range(count)]


def span_corruption_collate(sequences: Sequence[Sequence[int]], rng: np.random.Generator, sentinels: Sequence[int],
                            pad_id: int = 0, eos_id: int | None = 1, rate: float = 0.15,
                            mean_span: float = 3.0) -> dict[str, torch.Tensor]:
    """A batch for `Seq2SeqLM`: input_ids / attention_mask (right-padded) and labels (-100 on padding);
    the model builds decoder_input_ids by shifting the labels right."""
    pairs = [corrupt(s, rng, sentinels, rate, mean_span, eos_id) for s in sequences]
    width_in = max(len(p[0]) for p in pairs)
    width_out = max(len(p[1]) for p in pairs)
    input_ids = torch.full((len(pairs), width_in), pad_id, dtype=torch.long)
    labels = torch.full((len(pairs), width_out), IGNORE, dtype=torch.long)
    for i, (inp, tgt) in enumerate(pairs):
        input_ids[i, :len(inp)] = torch.tensor(inp)
        labels[i, :len(tgt)] = torch.tensor(tgt)
    mask = torch.zeros_like(input_ids)
    for i, (inp, _) in enumerate(pairs):
        mask[i, :len(inp)] = 1
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}
