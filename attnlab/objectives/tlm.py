"""Translation language modelling, TLM (Lample & Conneau 2019, §3.3), and its monolingual partner.

TLM concatenates a sentence and its translation into one input and masks words on both sides, so that a
masked English word can be recovered from the German context as well as the English one: the model is
pushed to align the two languages' representations. Two details make the halves look alike to the
model (§3.3, Figure 2): the positions restart at 0 where the second sentence begins, and every token
carries its language id, which selects a language embedding (`ModelConfig.num_languages`).

Worked example (prob=0.5, language ids en=0, de=1):
    ids      [CLS] a   dog  runs [SEP] [CLS] ein  hund rennt [SEP]
    position   0   1   2    3    4     0     1    2    3     4       reset at the second sentence
    langs      0   0   0    0    0     1     1    1    1     1
    labels        a         runs                  hund            round(3 * 0.5) = 2 per side

Each side is masked on its own (`mask_tokens` per half), so both carry exactly the configured share of
predicted tokens. Which language comes first is drawn per pair, as XLM trains both en-de and de-en.
`mono_collate` is plain MLM over single sentences with their language ids: the MLM baseline of the
experiment (research/xlm) and the MLM half of MLM+TLM. Both feed `mlm.mlm_loss`.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .mlm import IGNORE, Vocab, mask_tokens


def _pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, valid) for right-padded rows."""
    length = max(len(r) for r in rows)
    ids = np.full((len(rows), length), pad_id, dtype=np.int64)
    valid = np.zeros(ids.shape, dtype=bool)
    for i, r in enumerate(rows):
        ids[i, :len(r)], valid[i, :len(r)] = r, True
    return ids, valid


def _batch(inputs: np.ndarray, labels: np.ndarray, valid: np.ndarray, positions: np.ndarray,
           langs: np.ndarray, sparse: bool) -> dict[str, torch.Tensor]:
    batch = {"input_ids": torch.from_numpy(inputs), "labels": torch.from_numpy(labels),
             "attention_mask": torch.from_numpy(valid.astype(np.int64)),
             "position_ids": torch.from_numpy(positions), "langs": torch.from_numpy(langs)}
    if sparse:
        batch["masked_positions"] = batch["labels"] != IGNORE
    return batch


def mono_collate(sentences: Sequence[Sequence[int]], langs: Sequence[int], vocab: Vocab, rng: np.random.Generator,
                 prob: float = 0.15, pad_id: int = 0, sparse: bool = True) -> dict[str, torch.Tensor]:
    """MLM over single sentences (each already [CLS] ... [SEP]), language id `langs[i]` on every token of row i."""
    if len(sentences) != len(langs):
        raise ValueError(f"mono_collate: {len(sentences)} sentences but {len(langs)} language ids")
    ids, valid = _pad(sentences, pad_id)
    inputs, labels = mask_tokens(ids, vocab, rng, prob, valid=valid)
    positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape).copy()
    lang = np.broadcast_to(np.asarray(langs, dtype=np.int64)[:, None], ids.shape).copy()
    return _batch(inputs, labels, valid, positions, lang, sparse)


def tlm_collate(pairs: Sequence[tuple[Sequence[int], Sequence[int]]], langs: tuple[int, int], vocab: Vocab,
                rng: np.random.Generator, prob: float = 0.15, pad_id: int = 0, sparse: bool = True,
                swap: bool = True) -> dict[str, torch.Tensor]:
    """TLM batch from parallel pairs (a, b), each side already [CLS] ... [SEP], in languages langs = (la, lb).
    Row i is side1 + side2, where the order is drawn per pair when `swap` (else a first); positions restart
    at side2; both sides masked at rate `prob` separately; padding after side2."""
    if not pairs:
        raise ValueError("tlm_collate: no pairs")
    flip = rng.random(len(pairs)) < 0.5 if swap else np.zeros(len(pairs), dtype=bool)
    first = [b if f else a for (a, b), f in zip(pairs, flip)]
    second = [a if f else b for (a, b), f in zip(pairs, flip)]
    halves = []
    for side in (first, second):  # mask each language on its own: both get exactly the configured share
        ids, valid = _pad(side, pad_id)
        inputs, labels = mask_tokens(ids, vocab, rng, prob, valid=valid)
        halves.append((ids, inputs, labels, valid))
    la, lb = langs
    rows_in, rows_lab, rows_pos, rows_lang = [], [], [], []
    for i in range(len(pairs)):
        parts = [(h[1][i][h[3][i]], h[2][i][h[3][i]]) for h in halves]
        n1, n2 = len(parts[0][0]), len(parts[1][0])
        l1, l2 = (lb, la) if flip[i] else (la, lb)
        rows_in.append(np.concatenate([parts[0][0], parts[1][0]]))
        rows_lab.append(np.concatenate([parts[0][1], parts[1][1]]))
        rows_pos.append(np.concatenate([np.arange(n1), np.arange(n2)]))  # §3.3: positions reset per sentence
        rows_lang.append(np.array([l1] * n1 + [l2] * n2, dtype=np.int64))
    inputs, valid = _pad(rows_in, pad_id)
    labels, _ = _pad(rows_lab, IGNORE)
    positions, _ = _pad(rows_pos, 0)
    lang, _ = _pad(rows_lang, 0)
    return _batch(inputs, labels, valid, positions, lang, sparse)
