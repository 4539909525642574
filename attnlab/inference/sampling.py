"""Logits processing shared by every decoder loop (generate, beam search, the serving engine):
repetition penalty, top-k, nucleus (top-p), and the checks on sampling arguments."""
from __future__ import annotations

import torch

from .text_stream import check_sampling  # noqa: F401  (re-exported)

NEG = -1.0e9  # "impossible" score for beam bookkeeping (finite, so arithmetic on it stays defined)


def apply_repetition_penalty(logits: torch.Tensor, seqs: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL's penalty (Keskar et al. 2019): a token already in the sequence gets its logit divided by
    `penalty` when positive, multiplied when negative, so it always becomes less likely."""
    seen = logits.gather(1, seqs)
    seen = torch.where(seen < 0, seen * penalty, seen / penalty)
    return logits.scatter(1, seqs, seen)


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    k = min(k, logits.size(-1))
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus sampling (Holtzman et al. 2020): keep the smallest set of most likely tokens whose total
    probability reaches p. A token is dropped when the tokens ranked above it already reach p."""
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
    probs = sorted_logits.softmax(-1)
    mass_before = probs.cumsum(-1) - probs
    drop_sorted = mass_before >= p
    drop_sorted[..., 0] = False  # the most likely token always survives
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


