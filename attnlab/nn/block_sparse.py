"""BigBird's block-sparse attention (Zaheer et al. 2020, §2 and App. D, the "ITC" variant), computed
blockwise so that time and memory grow linearly with the sequence length.

The sequence is cut into n blocks of b tokens. Query blocks 0 and n-1 are global: they see every key,
and every query sees their keys. Every other query block i sees 5 + r key blocks: the global blocks 0
and n-1, the window i-1, i, i+1 (blocks 1 and n-2 have one window block that is already global) and r
random blocks. Each middle query thus scores (5 + r) b keys gathered into one dense tile, so the cost is
O(T (5 + r) b) instead of O(T^2).

Random blocks (App. D): in training each (head, query block) draws r distinct blocks among those it does
not already see. In eval mode transformers' BigBirdModel draws none: its r random slots all hold block 0,
so block 0's keys enter a middle row's softmax 1 + r times. `random=None` keeps that convention so that
outputs match transformers; the dense reference (`block_counts`, `dense_attention`) states it as a count
per (query block, key block) and computes softmax(s + log count).

Like transformers, sequences of at most (5 + 2 r) b tokens use full attention (`uses_blocks`): too few
blocks for the pattern to be sparse.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

SLOTS = 5  # global first, window i-1, i, i+1, global last
CHUNK = 16  # middle query blocks per gathered tile (1,024 queries at BigBird-base's block of 64)


def uses_blocks(length: int, block: int, num_random: int) -> bool:
    """Whether a sequence of `length` tokens is long enough for the block-sparse pattern (else full)."""
    return length > (SLOTS + 2 * num_random) * block


def draw_random_blocks(num_blocks: int, num_random: int, heads: int, generator: torch.Generator | None = None,
                       device=None) -> torch.Tensor:
    """(heads, n-2, r) random key blocks of query blocks 1..n-2: r distinct blocks that are neither global
    nor in the row's window (ranks of uniform noise, O(n^2) in blocks, not tokens)."""
    n = num_blocks
    rows = torch.arange(1, n - 1, device=device)[:, None]
    cols = torch.arange(n, device=device)[None, :]
    seen = ((cols - rows).abs() <= 1) | (cols == 0) | (cols == n - 1)
    if int((~seen).sum(1).min()) < num_random:
        raise ValueError(f"block-sparse attention: {n} blocks leave fewer than {num_random} random blocks per row")
    noise = torch.rand(heads, n - 2, n, generator=generator, device=device).masked_fill(seen, -1.0)
    return noise.topk(num_random, dim=-1).indices


def key_blocks(num_blocks: int, num_random: int, random: torch.Tensor | None = None, device=None):
    """The key blocks each middle query block 1..n-2 scores: ids (H or 1, n-2, 5 + r) and valid
    (n-2, 5 + r) (False: a window slot that repeats a global block, left out of the softmax)."""
    n = num_blocks
    i = torch.arange(1, n - 1, device=device)
    fixed = torch.stack([torch.zeros_like(i), i - 1, i, i + 1, torch.full_like(i, n - 1)], -1)
    valid = torch.ones(n - 2, SLOTS + num_random, dtype=torch.bool, device=device)
    valid[0, 1] = False  # block 1's left neighbour is block 0, already global
    valid[-1, 3] = False  # block n-2's right neighbour is block n-1, already global
    if random is None:  # transformers' eval mode: every random slot holds block 0
        random = torch.zeros(1, n - 2, num_random, dtype=torch.long, device=device)
    ids = torch.cat([fixed.expand(random.size(0), -1, -1), random.to(fixed.device)], -1)
    return ids, valid


def block_counts(num_blocks: int, num_random: int, random: torch.Tensor | None = None, device=None) -> torch.Tensor:
    """(H or 1, n, n): how many times query block i scores key block j (0 = never). The pattern as a
    matrix: what `dense_attention` and the viz heatmaps read."""
    n = num_blocks
    ids, valid = key_blocks(n, num_random, random, device)
    counts = torch.zeros(ids.size(0), n, n, dtype=torch.long, device=ids.device)
    counts[:, [0, n - 1]] = 1
    counts[:, 1:-1].scatter_add_(-1, ids, valid.long().expand_as(ids))
    return counts


def token_counts(length: int, block: int, num_random: int, random: torch.Tensor | None = None, device=None):
    """(H or 1, T, T) counts per (query, key) token; full attention (all ones) for a short sequence."""
    if not uses_blocks(length, block, num_random):
        return torch.ones(1, length, length, dtype=torch.long, device=device)
    counts = block_counts(length // block, num_random, random, device)
    return counts.repeat_interleave(block, -1).repeat_interleave(block, -2)


def dense_attention(q, k, v, key_padding: torch.Tensor | None, counts: torch.Tensor, scale: float):
    """The T x T reference: softmax(q k^T scale + log counts) v, keys with count 0 or padding masked.
    Returns (out, weights); the explicit path for `need_weights` and the tests' reference."""
    s = (q @ k.transpose(-2, -1)) * scale + counts.to(q.dtype).log()
    if key_padding is not None:
        s = s.masked_fill(~key_padding[:, None, None, :], float("-inf"))
    s = s.masked_fill(s == float("-inf"), torch.finfo(s.dtype).min)  # a row of padding sees all, not NaN
    weights = s.softmax(-1)
    return weights @ v, weights


def block_sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding: torch.Tensor | None,
                           block: int, num_random: int, random: torch.Tensor | None = None,
                           scale: float | None = None, dropout_p: float = 0.0) -> torch.Tensor:
    """q, k, v (B, H, T, d) with T a multiple of `block` and `uses_blocks(T, ...)`; key_padding (B, T) bool,
    True = real key, or None; random (H, n-2, r) from `draw_random_blocks`, or None (eval convention).
    Returns (B, H, T, d)."""
    b_, h, t, d = q.shape
    if t % block or not uses_blocks(t, block, num_random):
        raise ValueError(f"block-sparse attention: length {t} must be a multiple of block_size={block} and exceed "
                         f"(5 + 2 * {num_random}) blocks")
    n = t // block
    scale = d ** -0.5 if scale is None else scale
    low = torch.finfo(q.dtype).min  # not -inf: a query of padding only gets uniform weights instead of NaN
    qb, kb, vb = (x.reshape(b_, h, n, block, x.size(-1)) for x in (q, k, v))

    # global query blocks 0 and n-1: every key
    s = (qb[:, :, [0, n - 1]] @ k.transpose(-2, -1)[:, :, None]) * scale  # (B, H, 2, b, T)
    if key_padding is not None:
        s = s.masked_fill(~key_padding[:, None, None, None, :], low)
    p = F.dropout(s.softmax(-1), p=dropout_p) if dropout_p > 0 else s.softmax(-1)
    out_global = p @ v[:, :, None]  # (B, H, 2, b, d)

    # middle query blocks: gather their 5 + r key blocks into one tile each, CHUNK query blocks at a time
    # (without autograd only those chunks' tiles are alive at once)
    ids, valid = key_blocks(n, num_random, random, q.device)
    pad = key_padding.view(b_, 1, n, block).expand(b_, ids.size(0), n, block) if key_padding is not None else None
    mid = qb[:, :, 1:-1]
    mids = [_middle(mid[:, :, c:c + CHUNK], kb, vb, ids[:, c:c + CHUNK], valid[c:c + CHUNK], pad, scale,
                    dropout_p, low) for c in range(0, n - 2, CHUNK)]
    out = torch.cat([out_global[:, :, :1], *mids, out_global[:, :, 1:]], dim=2)
    return out.reshape(b_, h, t, -1)


def _middle(qb, kb, vb, ids, valid, pad, scale, dropout_p, low):
    """Outputs of query blocks qb (B, H, c, b, d) over their key blocks ids (H or 1, c, 5 + r)."""
    b_, h, c, block, d = qb.shape
    slots = ids.size(-1)
    flat = ids.reshape(1, ids.size(0), -1, 1, 1)
    kg = kb.gather(2, flat.expand(b_, h, -1, block, d)).view(b_, h, c, slots * block, d)
    vg = vb.gather(2, flat.expand(b_, h, -1, block, vb.size(-1))).view(b_, h, c, slots * block, vb.size(-1))
    s = (qb @ kg.transpose(-2, -1)) * scale  # (B, H, c, b, (5 + r) b)
    keep = valid.repeat_interleave(block, -1)[None, None]  # (1, 1, c, (5 + r) b)
    if pad is not None:  # the padding of the gathered keys
        keep = keep & pad.gather(2, ids.reshape(1, ids.size(0), -1, 1).expand(b_, -1, -1, block)).view(
            b_, ids.size(0), c, slots * block)
    s = s.masked_fill(~keep[..., None, :], low)
    p = F.dropout(s.softmax(-1), p=dropout_p) if dropout_p > 0 else s.softmax(-1)
    return p @ vg  # (B, H, c, b, d)
