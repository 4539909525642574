"""Logits processing shared by every decoder loop (generate, beam search, the serving engine):
repetition penalty, top-k, nucleus (top-p), and the checks on sampling arguments."""
from __future__ import annotations

import torch

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


def check_sampling(temperature: float, top_k: int | None, top_p: float | None, repetition_penalty: float,
                   num_beams: int, max_new_tokens: int) -> None:
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if top_k is not None and (not isinstance(top_k, int) or top_k <= 0):
        raise ValueError(f"top_k must be a positive integer, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must lie in (0, 1], got {top_p}")
    if not repetition_penalty > 0:
        raise ValueError(f"repetition_penalty must be > 0 (1.0 = none), got {repetition_penalty}")
    if not isinstance(num_beams, int) or num_beams < 1:
        raise ValueError(f"num_beams must be a positive integer, got {num_beams}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens}")
