"""Where a token is: learned absolute (BERT, GPT-2), sinusoidal (Vaswani et al. 2017, §3.5),
rotary (RoPE, Su et al. 2021) and bucketed relative bias (T5, Raffel et al. 2020, §2.1).

Learned absolute positions are a plain `nn.Embedding` and live in `embeddings.py`.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from . import fused


def sinusoidal_table(num_positions: int, dim: int, halves: bool = False, fairseq: bool = False,
                     padding_idx: int | None = None) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)),  PE(pos, 2i+1) = cos(pos / 10000^(2i/d)).

    Even columns hold sines, odd columns cosines of the same frequency, exactly as the paper writes it.
    `halves=True` keeps the same values but puts all sines first, then all cosines (CTRL's and
    tensor2tensor's layout).
    `fairseq=True` is fairseq's table (M2M-100, FSMT): the halves layout with frequencies
    10000^(-i/(d/2 - 1)) rather than 10000^(-2i/d) (the last pair turns exactly 10000 times slower than the
    first), computed in float32 as fairseq does, with the row `padding_idx` all zeros.
    """
    if fairseq:
        half = dim // 2
        freq = torch.exp(torch.arange(half).float() * -(math.log(10000) / (half - 1)))
        angle = torch.arange(num_positions).float()[:, None] * freq[None]
        table = torch.cat((torch.sin(angle), torch.cos(angle), torch.zeros(num_positions, dim % 2)), dim=1)
        if padding_idx is not None:
            table[padding_idx] = 0
        return table
    pos = torch.arange(num_positions, dtype=torch.float64)[:, None]
    two_i = torch.arange(0, dim, 2, dtype=torch.float64)
    angle = pos / torch.pow(10000.0, two_i / dim)
    table = torch.zeros(num_positions, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : dim // 2])
    if halves:
        table = torch.cat((table[:, 0::2], table[:, 1::2]), dim=1)
    return table.float()


class RotaryEmbedding(nn.Module):
    """RoPE: rotate each pair of query/key dimensions by an angle proportional to the position, so that
    q·k depends only on the distance between the two positions.

    The pairs are (i, i + d/2) ("rotate half"), the layout of Hugging Face's LLaMA; GGUF files, which pair
    (2i, 2i+1), are permuted into it when loaded.
    """

    def __init__(self, dim: int, theta: float = 10000.0) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """position_ids (B, T) -> cos, sin of shape (B, 1, T, dim) ready to broadcast over heads."""
        freqs = position_ids[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos()[:, None], emb.sin()[:, None]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    r = cos.size(-1)
    out = fused.rope(x, cos, sin) if r == x.size(-1) else None  # one pass at CPU inference (nn/fused.py)
    if out is not None:
        return out
    if r < x.size(-1):  # partial rotary (GPT-NeoX, Black et al. 2022, §2): only the first r dimensions turn
        return torch.cat((apply_rotary(x[..., :r], cos, sin), x[..., r:]), dim=-1)
    return (x * cos.to(x.dtype)) + (rotate_half(x) * sin.to(x.dtype))


def relative_position_bucket(relative: torch.Tensor, bidirectional: bool, num_buckets: int,
                             max_distance: int) -> torch.Tensor:
    """T5's buckets for (key position - query position): exact for small distances, logarithmic up to
    max_distance, one bucket beyond. Bidirectional splits the buckets between "before" and "after"."""
    bucket = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + (relative > 0).long() * num_buckets
        distance = relative.abs()
    else:
        distance = (-relative).clamp(min=0)  # a causal query only looks back
    exact = num_buckets // 2
    # log-spaced buckets for exact <= distance < max_distance; clamp keeps log() away from 0
    log_ratio = torch.log(distance.float().clamp(min=1) / exact) / math.log(max_distance / exact)
    far = (exact + (log_ratio * (num_buckets - exact)).long()).clamp(max=num_buckets - 1)
    return bucket + torch.where(distance < exact, distance, far)


class RelativePositionBias(nn.Module):
    """A learned scalar per (bucket, head), added to the attention scores before the softmax."""

    def __init__(self, num_heads: int, num_buckets: int = 32, max_distance: int = 128,
                 bidirectional: bool = True) -> None:
        super().__init__()
        self.num_buckets, self.max_distance, self.bidirectional = num_buckets, max_distance, bidirectional
        self.embedding = nn.Embedding(num_buckets, num_heads)

    def forward(self, query_len: int, key_len: int, offset: int = 0) -> torch.Tensor:
        """Bias of shape (1, heads, query_len, key_len); `offset` is the first query's position (KV cache)."""
        device = self.embedding.weight.device
        q = torch.arange(offset, offset + query_len, device=device)[:, None]
        k = torch.arange(key_len, device=device)[None, :]
        buckets = relative_position_bucket(k - q, self.bidirectional, self.num_buckets, self.max_distance)
        return self.embedding(buckets).permute(2, 0, 1)[None]
