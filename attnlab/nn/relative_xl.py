"""Transformer-XL relative attention and XLNet's two-stream attention (`position: relative_xl`).

Transformer-XL (Dai et al. 2019, §3.3) replaces absolute positions by the distance i - j between query and
key, encoded by fixed sinusoids R and read through a projection W_r of each layer, plus two learned
per-head vectors u (r_w_bias) and v (r_r_bias) in place of the query's absolute position:

    score(i, j) = (q_i + u)·k_j  +  (q_i + v)·W_r R_{i-j}  [+ (q_i + b)·s_ij]          (eq. in §3.3)

XLNet (Yang et al. 2019) adds relative segment encodings (§2.5: s_ij = seg_embed[0] if i and j share a
segment else seg_embed[1], with its own bias b = r_s_bias) and the two streams (§2.3): the content stream h
sees its own token; the query stream g sees the content of the tokens allowed by the factorization order
(`perm_mask`) but never its own, so it can predict it. Both streams read the same keys/values: the content
stream of the previous segment (`mems`, §2.4 segment recurrence) followed by the current one.

Here the extra terms become an additive score bias, so the one `Attention` (sdpa, explicit or tiled) runs
XLNet: sdpa adds the bias after scaling q·k, so the bias carries the scale itself. Masks are additive
-1e30, as in XLNet's code and transformers: a query that may see nothing (possible with an arbitrary
perm_mask) then attends uniformly instead of giving NaN, with the same numbers as transformers.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from ..config import ModelConfig

_BLOCKED = -1e30  # what XLNet subtracts from a blocked score (transformers does the same in fp32)


def relative_sinusoids(q_len: int, k_len: int, dim: int, bidirectional: bool, clamp_len: int,
                       device=None) -> torch.Tensor:
    """R: (rows, dim) sinusoids [sin | cos] of the distances k_len, k_len - 1, ... down to -(q_len - 1)
    (bidirectional) or 0 (causal: no query looks ahead). Row r holds distance k_len - r."""
    end = -q_len if bidirectional else -1
    dist = torch.arange(k_len, end, -1, device=device).float()
    if clamp_len > 0:  # XLNet's clamp_len: distances beyond it share one encoding
        dist = dist.clamp(-clamp_len, clamp_len)
    inv_freq = 1 / torch.pow(10000, torch.arange(0, dim, 2, device=device).float() / dim)
    angles = dist[:, None] * inv_freq
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


def shift_index(q_len: int, k_len: int, rows: int, device=None) -> torch.Tensor:
    """(q_len, k_len) row of R for each (query i, key j): query i sits at absolute position mlen + i (mlen =
    k_len - q_len cached tokens), so its distance to key j is mlen + i - j, which is row q_len - i + j.
    This is the "relative shift" of Transformer-XL's appendix B as a gather. Indices past the table belong
    to future keys of a causal model (masked anyway) and are clamped."""
    i = torch.arange(q_len, device=device)[:, None]
    j = torch.arange(k_len, device=device)[None, :]
    return (q_len - i + j).clamp(max=rows - 1)


@dataclass
class XLPositions:
    """What every layer's attention needs beside Q, K, V: the sinusoid table R (rows, d) after dropout, the
    gather index of `shift_index`, `segments` (B, Tq, Tk) bool, True = different segment (None: no
    segment term), and the stream's additive mask (B or 1, 1, Tq, Tk) or None."""
    table: torch.Tensor
    index: torch.Tensor
    segments: torch.Tensor | None
    mask: torch.Tensor | None

    def for_mask(self, mask: torch.Tensor | None) -> "XLPositions":
        return replace(self, mask=mask)


class RelativeXLBias(nn.Module):
    """One layer's relative-position parameters (each Attention's `xl`): W_r (`r`), u, v and, with
    relative segments, b and the two segment vectors. forward -> the scaled extra score terms + mask."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        h, d = config.num_heads, config.dim_head
        self.heads, self.head_dim = h, d
        self.r = nn.Linear(config.hidden_size, h * d, bias=False)
        std = config.initializer_range
        self.r_w_bias = nn.Parameter(torch.randn(h, d) * std)  # u: the content bias
        self.r_r_bias = nn.Parameter(torch.randn(h, d) * std)  # v: the position bias
        if config.relative_segments:
            self.r_s_bias = nn.Parameter(torch.randn(h, d) * std)
            self.seg_embed = nn.Parameter(torch.randn(2, h, d) * std)  # [same segment, different segment]
        else:
            self.r_s_bias = self.seg_embed = None

    def forward(self, q: torch.Tensor, k: torch.Tensor, pos: XLPositions, scale: float) -> torch.Tensor:
        """q (B, H, Tq, d), k (B, H, Tk, d) -> (B, H, Tq, Tk): scale * (u·k_j + (q_i + v)·W_r R_ij
        [+ (q_i + b)·s_ij]) + mask. q·k itself stays with the attention kernel."""
        b, h, tq, _ = q.shape
        content = torch.einsum("hd,bhjd->bhj", self.r_w_bias, k)[:, :, None, :]
        r = self.r(pos.table.to(q.dtype)).view(-1, h, self.head_dim)
        position = torch.einsum("bhid,rhd->bhir", q + self.r_r_bias[:, None], r)
        position = position.gather(-1, pos.index.expand(b, h, tq, -1))
        bias = content + position
        if self.seg_embed is not None and pos.segments is not None:
            seg = torch.einsum("bhid,shd->bhis", q + self.r_s_bias[:, None], self.seg_embed)
            bias = bias + torch.where(pos.segments[:, None], seg[..., 1:], seg[..., :1])
        bias = bias * scale
        if pos.mask is None:
            return bias
        # -1e30 overflows float16 to -inf (a row that sees nothing would be NaN): use the dtype's own minimum
        return bias + pos.mask.clamp(min=torch.finfo(bias.dtype).min).to(bias.dtype)


def stream_masks(q_len: int, mlen: int, batch: int, causal: bool, attention_mask: torch.Tensor | None,
                 perm_mask: torch.Tensor | None, device=None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Additive masks (B or 1, 1, Tq, mlen + Tq) of the content and the query stream, or (None, None) when
    every query sees every key. perm_mask (B, Tq, Tq): 1 = query i may not see token j (XLNet's convention);
    attention_mask (B, Tq): 0 = padding; the cached tokens are always visible. The query stream's mask is
    the union; the content stream's is the same with each token's own position opened again."""
    k_len = mlen + q_len
    blocked = None
    if causal:  # attn_type "uni": no key after the query's own position
        blocked = torch.ones(q_len, k_len, dtype=torch.bool, device=device).triu(mlen + 1)[None]
    data = None
    if attention_mask is not None:
        data = (attention_mask == 0)[:, None, :].expand(-1, q_len, -1)
    if perm_mask is not None:
        if perm_mask.shape != (batch, q_len, q_len):
            raise ValueError(f"perm_mask has shape {tuple(perm_mask.shape)}; expected {(batch, q_len, q_len)}")
        data = perm_mask > 0 if data is None else data | (perm_mask > 0)
    if data is not None:
        if mlen:
            data = torch.cat([torch.zeros(data.size(0), q_len, mlen, dtype=torch.bool, device=data.device), data], -1)
        blocked = data if blocked is None else blocked | data
    if blocked is None:
        return None, None
    own = torch.zeros(q_len, k_len, dtype=torch.bool, device=blocked.device)
    own[:, mlen:] = torch.eye(q_len, dtype=torch.bool, device=blocked.device)
    as_bias = lambda m: torch.zeros(m.shape, device=m.device).masked_fill(m, _BLOCKED)[:, None]  # noqa: E731
    return as_bias(blocked & ~own), as_bias(blocked)


def segment_matrix(token_type_ids: torch.Tensor | None, mlen: int) -> torch.Tensor | None:
    """(B, Tq, mlen + Tq) bool, True where query and key lie in different segments. Cached tokens count as
    segment 0, as in XLNet's code: only equality matters (§2.5), not which segment is which."""
    if token_type_ids is None:
        return None
    keys = token_type_ids
    if mlen:
        keys = torch.cat([token_type_ids.new_zeros(token_type_ids.size(0), mlen), token_type_ids], dim=1)
    return token_type_ids[:, :, None] != keys[:, None, :]


def to_positions(g: torch.Tensor, target_mapping: torch.Tensor | None) -> torch.Tensor:
    """Query-stream rows (B, M, d), one per prediction, onto the sequence positions they predict (B, T, d):
    target_mapping (B, M, T) is one-hot per row in pretraining. Identity without a mapping."""
    return g if target_mapping is None else torch.einsum("bmt,bmd->btd", target_mapping.to(g.dtype), g)


def from_positions(x: torch.Tensor, target_mapping: torch.Tensor | None) -> torch.Tensor:
    """The inverse gather: (B, T, d) attention outputs back to the M prediction rows."""
    return x if target_mapping is None else torch.einsum("bmt,btd->bmd", target_mapping.to(x.dtype), x)


def cache_mems(prev: torch.Tensor | None, current: torch.Tensor, mem_len: int | None,
               reuse_len: int | None) -> torch.Tensor:
    """Segment recurrence (Dai et al. 2019, §3.2): the next segment's memory of one layer is this layer's
    input, (B, T, d), appended to the previous memory, cut to the last mem_len (None / 0: keep all), with
    only the first reuse_len tokens of the current segment kept (XLNet §2.4); no gradient flows back."""
    if reuse_len:
        current = current[:, :reuse_len]
    mem = current if prev is None else torch.cat([prev, current], dim=1)
    if mem_len:
        mem = mem[:, -mem_len:]
    return mem.detach()


class RelativeXL(nn.Module):
    """The stack-level part (the Encoder's `xl`): the query stream's start vector w (`mask_emb`, §2.3: g
    starts from a trainable vector, not from the token) and the settings of the sinusoids and the memory."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.mask_emb = nn.Parameter(torch.randn(1, 1, config.hidden_size) * config.initializer_range)
        self.dropout = nn.Dropout(config.dropout)
        self.hidden_size, self.causal = config.hidden_size, config.causal
        self.clamp_len = int(config.extra.get("clamp_len") or -1)
        self.mem_len, self.reuse_len = config.mem_len, config.reuse_len

    def positions(self, q_len: int, mlen: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        table = relative_sinusoids(q_len, mlen + q_len, self.hidden_size, not self.causal, self.clamp_len, device)
        return self.dropout(table), shift_index(q_len, mlen + q_len, table.size(0), device)

    def query_stream(self, batch: int, num_predict: int) -> torch.Tensor:
        return self.dropout(self.mask_emb.expand(batch, num_predict, -1))
