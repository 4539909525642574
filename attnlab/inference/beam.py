"""Beam search: keep the `num_beams` most likely partial continuations instead of one.

Each step scores every (beam, next token) pair by the beam's summed log-probability plus the token's,
keeps the best candidates, and moves a candidate that ends (EOS, or the length limit) to the finished
list with score  sum_logprob / new_len ** length_penalty  (length_penalty > 0 favours longer outputs).

It follows transformers' vectorised beam search step for step, so that a checkpoint gives the same
output in both: 2*num_beams candidates per step (so that enough beams survive when some end), only
candidates among the top num_beams may finish, and the same early-stopping rules:
  early_stopping=True     stop once num_beams hypotheses have finished;
  early_stopping=False    stop when the best running beam, scored at its current length, cannot beat
                          the worst finished one;
  early_stopping="never"  like False, but scored at the longest possible length (exact when lp > 0).
"""
from __future__ import annotations

import torch

from .kv_cache import KVCache
from .sampling import NEG, apply_repetition_penalty


def _take(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x (B, K, ...) -> x[b, idx[b, j], ...] for idx (B, J)."""
    while idx.dim() < x.dim():
        idx = idx.unsqueeze(-1)
    return torch.take_along_dim(x, idx, dim=1)

@torch.inference_mode()
def beam_search(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, *, num_beams: int,
                max_new_tokens: int, length_penalty: float = 1.0, early_stopping: bool | str = False,
                repetition_penalty: float = 1.0, eos_token_id: list[int] | None = None,
                pad_token_id: int | None = None) -> torch.Tensor:
    if early_stopping not in (True, False, "never"):
        raise ValueError(f"early_stopping must be True, False or 'never', got {early_stopping!r}")
    cfg = model.config
    b, prompt_len = input_ids.shape
    n, device = num_beams, input_ids.device
    max_len = prompt_len + max_new_tokens
    eos = torch.tensor(eos_token_id or [], dtype=torch.long, device=device)
    fill = pad_token_id if pad_token_id is not None else (cfg.pad_token_id if cfg.pad_token_id is not None
                                                          else (int(eos[0]) if eos.numel() else 0))
    k = max(2, 1 + eos.numel()) * n            # candidates kept per step
    top_n = torch.arange(k, device=device) < n  # only these may become finished hypotheses

    running = torch.full((b, n, max_len), fill, dtype=torch.long, device=device)
    running[:, :, :prompt_len] = input_ids[:, None]
    running_scores = torch.zeros(b, n, device=device)
    running_scores[:, 1:] = NEG  # all beams start equal: let only the first one propose tokens
    done = running.clone()
    done_scores = torch.full((b, n), NEG, device=device)
    done_len = torch.zeros(b, n, dtype=torch.long, device=device)
    is_done = torch.zeros(b, n, dtype=torch.bool, device=device)
    improvable = torch.ones(b, 1, dtype=torch.bool, device=device)

    padded = attention_mask is not None and not bool(attention_mask.all())
    mask = attention_mask.long().repeat_interleave(n, dim=0) if padded else None
    cache = KVCache.for_model(model, max_length=max_len)
    step_input = input_ids.repeat_interleave(n, dim=0)
    batch_offset = (torch.arange(b, device=device) * n)[:, None]
    cur = prompt_len
    while True:
        out = model(step_input, attention_mask=mask, past_key_values=cache, use_cache=True, logits_to_keep=1)
        logp = out.logits[:, -1].float().log_softmax(-1)
        if repetition_penalty != 1.0:
            logp = apply_repetition_penalty(logp, running[:, :, :cur].reshape(b * n, cur), repetition_penalty)
        vocab = logp.size(-1)
        scores = (logp.view(b, n, vocab) + running_scores[:, :, None]).view(b, n * vocab)
        cand_scores, flat = torch.topk(scores, k)
        src_beam, token = flat // vocab, flat % vocab
        cand = _take(running, src_beam)
        cand[:, :, cur] = token
        ends = torch.isin(token, eos) if eos.numel() else torch.zeros_like(token, dtype=torch.bool)
        if cur + 1 >= max_len:
            ends = torch.ones_like(ends)

        # the best num_beams candidates that go on are next step's beams
        live_scores = cand_scores + ends.float() * NEG
        keep = torch.topk(live_scores, n).indices
        running, running_scores = _take(cand, keep), _take(live_scores, keep)
        running_src = _take(src_beam, keep)

        # candidates that just ended compete with the finished hypotheses for the num_beams slots
        final = cand_scores / ((cur + 1 - prompt_len) ** length_penalty)
        full = is_done.all(-1, keepdim=True) & (early_stopping is True)
        final = final + full.float() * NEG + (~improvable).float() * NEG
        just_done = ends & top_n[None]
        final = final + (~just_done).float() * NEG
        merged_scores = torch.cat([done_scores, final], dim=1)
        best = torch.topk(merged_scores, n).indices
        done = _take(torch.cat([done, cand], dim=1), best)
        done_scores = _take(merged_scores, best)
        done_len = _take(torch.cat([done_len, torch.full_like(token, cur + 1 - prompt_len)], dim=1), best)
        is_done = _take(torch.cat([is_done, just_done], dim=1), best)

        cur += 1
        # can a running beam still beat a finished one? (see the module docstring for the length used)
        hyp_len = (max_len if early_stopping == "never" and length_penalty > 0 else cur) - prompt_len
        best_running = running_scores[:, :1] / (hyp_len ** length_penalty)
        worst_done = torch.where(is_done, done_scores.min(dim=1, keepdim=True).values, NEG)
        improvable = improvable & (best_running > worst_done).any(-1, keepdim=True)
        go_on = bool(improvable.any()) and not (bool(is_done.all()) and early_stopping is True) \
            and not bool(ends.all())
        if not go_on:
            break
        cache.reorder((running_src + batch_offset).flatten())
        step_input = running[:, :, cur - 1].reshape(b * n, 1)
        if mask is not None:
            mask = torch.cat([mask, mask.new_ones(b * n, 1)], dim=1)

    best_len = int(done_len[:, 0].max())
    return done[:, 0, :prompt_len + best_len]
