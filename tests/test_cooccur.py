"""PPMI-SVD word vectors (attnlab.data.cooccur) and `model.embedding_init: ppmi` in a pretrain recipe."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab.config import ConfigError
from attnlab.data.cooccur import cooccurrence_counts, ppmi, ppmi_embeddings


def test_counts_are_symmetric_and_weighted_by_distance():
    c = cooccurrence_counts([np.array([0, 1, 2])], vocab_size=3, window=2)
    assert np.allclose(c, c.T)
    assert c[0, 1] == 1.0 and c[1, 2] == 1.0 and c[0, 2] == 0.5 and c[0, 0] == 0.0


def test_ppmi_by_hand():
    c = np.array([[0, 2], [2, 0]], dtype=np.float32)   # total 4, rows 2/2, smoothed context 2/2
    assert np.allclose(ppmi(c), [[0, np.log(2)], [np.log(2), 0]])


def _two_topic_stream(n: int = 4000, seed: int = 0) -> np.ndarray:
    """Sentences drawn from two topics: tokens 0-4 only co-occur with each other, as do 5-9."""
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.integers(0, 5, 8) if rng.random() < 0.5 else rng.integers(5, 10, 8)
                           for _ in range(n)])


def test_vectors_put_words_of_one_topic_together():
    vecs = ppmi_embeddings([_two_topic_stream()], vocab_size=12, dim=4, window=2, std=0.1)
    assert vecs.shape == (12, 4) and vecs.dtype == np.float32
    assert np.isclose(vecs.std(), 0.1, rtol=1e-3)
    unit = vecs[:10] / np.linalg.norm(vecs[:10], axis=1, keepdims=True)
    cos = unit @ unit.T
    same = np.mean([cos[i, j] for i in range(10) for j in range(10) if i != j and (i < 5) == (j < 5)])
    other = np.mean([cos[i, j] for i in range(10) for j in range(10) if (i < 5) != (j < 5)])
    assert same > 0.5 > other
    assert not vecs[10:].any()      # never-seen tokens keep zero rows


def test_clear_errors():
    with pytest.raises(ValueError, match="at most"):
        cooccurrence_counts([np.array([0, 1])], vocab_size=30000)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        cooccurrence_counts([np.array([0, 7])], vocab_size=5)
    with pytest.raises(ValueError, match="empty"):
        ppmi(np.zeros((3, 3), dtype=np.float32))
