"""XLNet's permutation language modelling (Yang et al. 2019, §2.2-2.3) with partial prediction (§2.3).

For each sequence, sample a factorization order z (a random permutation of its real positions) and predict
only its last 1/K tokens (K = 6 in the paper's pretraining, §3.1), each from the tokens before it in z:

    max  E_z [ sum_{t > c} log p(x_{z_t} | x_{z_<t}) ],     c = |z| - round(|z| / K)

The order is not applied to the input: the tokens keep their places (and their relative positions) and the
order lives only in the attention masks (§2.3, "we only permute the factorization order, not the sequence
order"). `perm_mask[i, j] = 1` = position i may not see position j:
- a target sees every context token and the targets before it in z; its query stream never sees itself,
  its content stream does (the Encoder opens the diagonal for the content stream);
- a context token (the first c of z) sees every context token but no target, as XLNet's released code does
  (the context is only conditioned on, so its internal order does not matter).
Hence no target's prediction depends on itself or on a later target, through either stream, in any layer.
`target_mapping` (B, M, T) one-hot picks the M prediction rows; `labels` (B, M), -100 for unused rows.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

IGNORE = -100


def sample_permutation(valid: np.ndarray, k: float, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """valid (B, T) bool (real tokens). Returns `order` (B, T): each row's factorization order as positions
    (-1 past the real tokens), `rank` (B, T): a position's index in it (-1 for padding), `num_predict` (B,)
    and `targets` (B, M): the predicted positions in order (-1 = unused row)."""
    b, t = valid.shape
    order = np.full((b, t), -1, dtype=np.int64)
    rank = np.full((b, t), -1, dtype=np.int64)
    num = np.zeros(b, dtype=np.int64)
    for row in range(b):
        real = np.flatnonzero(valid[row])
        z = rng.permutation(real)
        order[row, :len(z)] = z
        rank[row, z] = np.arange(len(z))
        num[row] = min(len(z), max(1, int(round(len(z) / k)))) if len(z) else 0
    m = max(int(num.max()), 1)
    targets = np.full((b, m), -1, dtype=np.int64)
    for row in range(b):
        n, length = num[row], int(valid[row].sum())
        targets[row, :n] = order[row, length - n:length]
    return {"order": order, "rank": rank, "num_predict": num, "targets": targets}


def plm_masks(valid: np.ndarray, rank: np.ndarray, num_predict: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """perm_mask (B, T, T) and target_mapping (B, M, T) as float32 (transformers' dtype)."""
    b, t = valid.shape
    lengths = valid.sum(1)
    is_target = valid & (rank >= (lengths - num_predict)[:, None])
    # i may not see j when j is a target no earlier than i in the order (context ranks all come first)
    perm = is_target[:, None, :] & (rank[:, None, :] >= rank[:, :, None])
    perm &= valid[:, :, None]  # padding rows are never read; their keys are hidden by attention_mask
    mapping = np.zeros((b, targets.shape[1], t), dtype=np.float32)
    rows, cols = np.nonzero(targets >= 0)
    mapping[rows, cols, targets[rows, cols]] = 1.0
    return perm.astype(np.float32), mapping


def plm_collate(examples: list, rng: np.random.Generator, k: float = 6.0, pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Stack (or right-pad) token blocks and sample one factorization order per row: input_ids,
    perm_mask, target_mapping, labels (+ attention_mask when padded)."""
    length = max(len(e) for e in examples)
    ids = np.full((len(examples), length), pad_id, dtype=np.int64)
    valid = np.zeros(ids.shape, dtype=bool)
    for i, e in enumerate(examples):
        ids[i, :len(e)], valid[i, :len(e)] = e, True
    s = sample_permutation(valid, k, rng)
    perm, mapping = plm_masks(valid, s["rank"], s["num_predict"], s["targets"])
    labels = np.where(s["targets"] >= 0, np.take_along_axis(ids, np.maximum(s["targets"], 0), 1), IGNORE)
    batch = {"input_ids": torch.from_numpy(ids), "perm_mask": torch.from_numpy(perm),
             "target_mapping": torch.from_numpy(mapping), "labels": torch.from_numpy(labels)}
    if not valid.all():
        batch["attention_mask"] = torch.from_numpy(valid.astype(np.int64))
    return batch


def plm_loss(model, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Cross-entropy of the query stream's predictions (a PermutationLM) at the target rows."""
    inputs = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "perm_mask", "target_mapping",
                                                      "token_type_ids")}
    out = model(**inputs, use_mems=False)
    logits = out.logits.flatten(0, 1).float()
    target = batch["labels"].flatten()
    loss = F.cross_entropy(logits, target, ignore_index=IGNORE)
    keep = target != IGNORE
    with torch.no_grad():
        n = keep.sum()
        sums = {"plm_loss_sum": loss.detach() * n, "plm_n": n.float(),
                "plm_correct": ((logits.argmax(-1) == target) & keep).sum().float()}
    return loss, sums


def plm_metrics(sums: dict[str, float]) -> dict[str, float]:
    n = max(sums["plm_n"], 1)
    return {"loss": sums["plm_loss_sum"] / n, "accuracy": sums["plm_correct"] / n}
