"""Contrastive retrieval loss with in-batch negatives (InfoNCE; DPR, Karpukhin et al. 2020 §3.2; ColBERT,
Khattab & Zaharia 2020 §3.4 trains the same softmax over its MaxSim scores).

A batch holds B (query, positive passage) pairs. Every query is scored against all B passages; the other
B - 1 passages are its negatives for free. The loss is cross-entropy of softmax(scores / temperature)
against the diagonal: -log exp(s(q_i, p_i)/t) / sum_j exp(s(q_i, p_j)/t). The batch must not hold the same
passage twice (a duplicate would be a positive labelled as a negative).

Scores (torch, differentiable, over padded hidden states):
  dense_scores   cosine of the mean-pooled vectors, (Bq, Bp)
  maxsim_scores  sum over real query tokens of the max cosine over real passage tokens, (Bq, Bp)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)


def dense_scores(q_hidden, q_mask, p_hidden, p_mask) -> torch.Tensor:
    q = F.normalize(_mean(q_hidden, q_mask), dim=-1)
    p = F.normalize(_mean(p_hidden, p_mask), dim=-1)
    return q @ p.T


def maxsim_scores(q_hidden, q_mask, p_hidden, p_mask) -> torch.Tensor:
    q = F.normalize(q_hidden, dim=-1)
    p = F.normalize(p_hidden, dim=-1)
    sim = torch.einsum("aid,bjd->abij", q, p)                      # (Bq, Bp, Lq, Lp) token cosines
    sim = sim.masked_fill(~p_mask.bool()[None, :, None, :], float("-inf"))
    best = sim.amax(-1)                                            # each query token's best passage token
    return (best * q_mask[:, None, :].to(best.dtype)).sum(-1)      # padding query tokens add nothing


SCORERS = {"dense": dense_scores, "colbert": maxsim_scores}


def info_nce(scores: torch.Tensor, temperature: float) -> torch.Tensor:
    """Mean over queries of cross-entropy with the matched passage (the diagonal) as the label."""
    if scores.ndim != 2 or scores.shape[0] != scores.shape[1]:
        raise ValueError(f"info_nce needs a square (queries, passages) score matrix, got {tuple(scores.shape)}")
    labels = torch.arange(scores.shape[0], device=scores.device)
    return F.cross_entropy(scores / temperature, labels)
