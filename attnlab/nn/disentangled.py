"""DeBERTa's disentangled attention (He et al. 2021, §3.1, eq. 2-4), with DeBERTa-v2's log buckets and
shared position keys.

Each token is two vectors: its content H_i and its position relative to the other token, P_δ(i,j). The
score of query i for key j sums three products instead of one:

    A_ij = Q^c_i · K^c_j  +  Q^c_i · K^r_δ(i,j)  +  K^c_j · Q^r_δ(j,i)
           content->content  content->position     position->content
           ("c2c", Attention)     ("c2p")               ("p2c")

with K^r = P W_k,r and Q^r = P W_q,r, projections of one table P of 2k relative-position embeddings that
every layer shares, and the sum is scaled by 1/sqrt((1 + number of position terms) d) (§3.1: one sqrt(d)
per term keeps the variance of the scores). δ(i, j) = i - j, clamped to [-k, k) and shifted by k to index P.

DeBERTa-v2 (the 1.5B model, He et al. 2021 §5.3: buckets as in T5, position projections shared):
distances beyond b/2 (b = position_buckets) share log-spaced buckets up to max_relative_positions, so that P has 2b rows whatever the
sequence length; `share_att_key` projects P with the layer's own W_q, W_k rather than separate matrices;
a LayerNorm on P (`relative_embedding_norm`).

`RelativePositions` (owned by the Encoder) gives (P, index); `DisentangledBias` (owned by each Attention)
turns the layer's Q, K into the c2p + p2c scores, which attention adds as a bias to its own Q Kᵀ, so the
fused, explicit and tiled paths all serve DeBERTa unchanged.
"""
from __future__ import annotations

import torch
from torch import nn

from ..config import ModelConfig
from .norms import make_norm


def log_bucket(relative: torch.Tensor, buckets: int, max_position: int) -> torch.Tensor:
    """Distances |δ| <= b/2 stay exact; farther ones map to b/2 + ceil(log(|δ| / (b/2)) / log((max_position
    - 1) / (b/2)) * (b/2 - 1)), keeping the sign: b/2 - 1 log-spaced buckets on each side. Computed in
    float32 as DeBERTa does, so that ceil() puts each distance in the same bucket as the checkpoints saw."""
    mid = buckets // 2
    sign = torch.sign(relative)
    distance = relative.abs()
    near = distance <= mid
    # near distances never use the log; give them a harmless value (the log of a ratio below 1 is negative)
    far = torch.where(near, torch.full_like(distance, mid), distance)
    ratio = torch.log(far / mid) / torch.log(torch.tensor((max_position - 1) / mid))
    log_pos = torch.ceil(ratio * (mid - 1)) + mid
    return torch.where(near, relative.float(), log_pos * sign).long()


def relative_index(length: int, span: int, buckets: int, max_position: int, device=None) -> torch.Tensor:
    """(length, length) rows of the table P for query i and key j: δ(i, j) = i - j (bucketed when buckets > 0)
    plus span, clamped to [0, 2 span)."""
    pos = torch.arange(length, device=device)
    relative = pos[:, None] - pos[None, :]
    if buckets > 0:
        relative = log_bucket(relative, buckets, max_position)
    return (relative + span).clamp(0, 2 * span - 1)


class RelativePositions(nn.Module):
    """The table P of 2k relative-position embeddings shared by every layer, optionally layer-normed."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.span, self.buckets = config.relative_span, config.position_buckets
        self.max_position = config.max_relative_positions or config.max_position_embeddings
        self.embeddings = nn.Embedding(2 * self.span, config.hidden_size)
        self.norm = make_norm(config) if config.relative_embedding_norm else None

    def forward(self, length: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        table = self.embeddings.weight
        if self.norm is not None:
            table = self.norm(table)
        return table, relative_index(length, self.span, self.buckets, self.max_position, device or table.device)


class DisentangledBias(nn.Module):
    """One layer's c2p and p2c scores, already scaled: added to Q Kᵀ·scale inside attention."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.kinds = tuple(config.disentangled_attention)
        self.shared = config.share_att_key
        d, width = config.hidden_size, config.num_heads * config.dim_head
        # without share_att_key each term has its own projection of P (DeBERTa v1: W_k,r and W_q,r)
        self.pos_k = nn.Linear(d, width) if "c2p" in self.kinds and not self.shared else None
        self.pos_q = nn.Linear(d, width) if "p2c" in self.kinds and not self.shared else None
        self.dropout = nn.Dropout(config.dropout)  # on P, in each layer (DeBERTa's pos_dropout)
        self.scale = (config.dim_head * (1 + len(self.kinds))) ** -0.5

    def project(self, positions: tuple[torch.Tensor, torch.Tensor], q_proj: nn.Module, k_proj: nn.Module) -> dict:
        """K_r and/or Q_r of the table, (2k, H d). q_proj / k_proj: the layer's W_q, W_k (used when shared).
        Attention calls this before projecting its own input, so that a forward hook on W_q / W_k (the
        attention page's neuron view) is left holding the content projection, which it wants."""
        table = self.dropout(positions[0])
        out = {}
        if "c2p" in self.kinds:
            out["c2p"] = (k_proj if self.shared else self.pos_k)(table)
        if "p2c" in self.kinds:
            out["p2c"] = (q_proj if self.shared else self.pos_q)(table)
        return out

    def forward(self, q: torch.Tensor, k: torch.Tensor, projected: dict, index: torch.Tensor) -> torch.Tensor:
        """q (B, H, T, d), k (B, H, T, d): the layer's queries and keys; `projected` from `project`, `index`
        from RelativePositions. Returns (B, H, T, T) scores."""
        b, h, t, d = q.shape
        if k.size(2) != t:
            raise ValueError("disentangled attention scores a sequence against itself "
                             "(no KV cache, no cross-attention)")
        heads = lambda x: x.view(-1, h, d).transpose(0, 1)  # (2k, H d) -> (H, 2k, d)  # noqa: E731
        scores = torch.zeros((), dtype=q.dtype, device=q.device)
        if "c2p" in projected:
            # query i against every relative position, then pick δ(i, j) for each key j
            c2p = torch.matmul(q, heads(projected["c2p"]).transpose(-1, -2))   # (B, H, T, 2k)
            scores = scores + c2p.gather(-1, index.expand(b, h, t, t))
        if "p2c" in projected:
            # key j against every relative position, picking δ(i, j) for each query i (row j of the
            # transposed index), then back to (query, key) order
            p2c = torch.matmul(k, heads(projected["p2c"]).transpose(-1, -2))   # (B, H, T, 2k)
            scores = scores + p2c.gather(-1, index.t().expand(b, h, t, t)).transpose(-1, -2)
        return scores * self.scale
