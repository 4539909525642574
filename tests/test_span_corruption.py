"""T5 span corruption: the worked example's shape, exact reconstruction, and over many samples a noise
rate of 15% and a mean span length of 3 (within tolerance)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab.objectives.span_corruption import (corrupt, random_spans_noise_mask, span_corruption_collate,
                                                t5_sentinels)

SENT = t5_sentinels(1000)


def _spans(mask: np.ndarray) -> list[int]:
    lengths, run = [], 0
    for m in mask:
        if m:
            run += 1
        elif run:
            lengths.append(run)
            run = 0
    return lengths + ([run] if run else [])


def test_rate_and_span_length_statistics():
    rng = np.random.default_rng(0)
    noise = total = 0
    spans = []
    for _ in range(2000):
        length = int(rng.integers(20, 200))
        mask = random_spans_noise_mask(length, rng)
        noise += int(mask.sum())
        total += length
        spans += _spans(mask)
        assert not mask.all() and mask.any()
    assert abs(noise / total - 0.15) < 0.005
    assert abs(np.mean(spans) - 3.0) < 0.15
    # span lengths vary (a random cut, not fixed blocks of 3)
    assert min(spans) == 1 and max(spans) >= 8


def test_corrupt_reconstructs_the_text():
    rng = np.random.default_rng(1)
    for _ in range(200):
        ids = rng.integers(5, 900, size=int(rng.integers(2, 60))).tolist()
        inputs, targets = corrupt(ids, rng, SENT, eos_id=1)
        assert inputs[-1] == targets[-1] == 1
        # rebuild the text: each input sentinel is replaced by what follows the same sentinel in the target
        fill, cur = {}, None
        for t in targets[:-1]:
            if t in SENT:
                cur = t
                fill[cur] = []
            else:
                fill[cur].append(t)
        rebuilt = [x for t in inputs[:-1] for x in (fill[t] if t in SENT else [t])]
        assert rebuilt == ids
        assert [t for t in inputs if t in SENT] == SENT[:len([t for t in inputs if t in SENT])]
        assert targets[0] == SENT[0] or inputs[0] == SENT[0]


def test_worked_example_shape():
    rng = np.random.default_rng(4)
    words = list(range(10, 20))
    inputs, targets = corrupt(words, rng, SENT, rate=0.3, mean_span=2, eos_id=1)
    dropped = [t for t in targets if t not in SENT and t != 1]
    assert len(dropped) == 3 and len([t for t in inputs if t in SENT]) == 2


def test_collate_for_the_model():
    rng = np.random.default_rng(2)
    batch = span_corruption_collate([list(range(5, 40)), list(range(5, 25))], rng, SENT, pad_id=0, eos_id=1)
    assert batch["input_ids"].shape[0] == 2 and batch["attention_mask"][1].sum() < batch["attention_mask"][0].sum()
    assert (batch["labels"] == -100).any() and (batch["input_ids"][batch["attention_mask"] == 0] == 0).all()
    with pytest.raises(ValueError, match="sentinels"):
        corrupt(list(range(100)), rng, SENT[:2])
    from attnlab.config import preset
    from attnlab.models.seq2seq import Seq2SeqLM
    torch.manual_seed(0)
    model = Seq2SeqLM(preset("t5-small", vocab_size=1000, hidden_size=16, num_layers=1, num_heads=2, head_dim=8,
                             intermediate_size=32, extra={"num_decoder_layers": 1}))
    assert torch.isfinite(model(**batch).loss)
