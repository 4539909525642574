"""Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs"): replace exp(q.k) by a kernel
phi(q).phi(k) with phi(x) = elu(x) + 1 (§3.2.1), so that associativity removes the T x T matrix:

    V'_i = phi(Q_i)^T S_i / (phi(Q_i)^T z_i + eps),   S_i = sum_{j<=i} phi(K_j) V_j^T,   z_i = sum_{j<=i} phi(K_j)

(eq. 9 causal, §3.3; without the j <= i limit the sums run over every key). Three forms with one meaning:
- parallel, for training: chunks of C positions; inside a chunk the C x C masked products, across chunks
  the running (S, z) carried forward. O(T C d + T d^2) time, O(T d + d^2) memory (the cumulative-sum
  form of the paper's eq. 9 with S_i kept only at chunk ends).
- recurrent, for decoding (§3.4, eq. 16-20): one token updates S += phi(k) v^T, z += phi(k); O(d^2)
  per token whatever the position: `LinearAttentionCache` keeps (S, z) per layer for generation.
- any KV cache also works: the cached keys are folded into (S, z) again at each step (O(t) per token).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

EPS = 1e-6  # the denominator's guard, as the authors' fast-transformers library
CHUNK = 64


def feature_map(x: torch.Tensor) -> torch.Tensor:
    """phi(x) = elu(x) + 1 > 0 (§3.2.1): keeps every similarity positive, so the normaliser never vanishes."""
    return F.elu(x) + 1


def _features(q, k, key_padding):
    fq, fk = feature_map(q), feature_map(k)
    if key_padding is not None:  # a padded key adds nothing to S or z
        fk = fk * key_padding[:, None, -k.size(2):, None].to(fk.dtype)
    return fq, fk


def linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                     key_padding: torch.Tensor | None = None, state: tuple[torch.Tensor, torch.Tensor] | None = None,
                     chunk: int = CHUNK, eps: float = EPS) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Parallel form. q (B, H, Tq, d); k, v (B, H, Tk, d / d_v) with Tk >= Tq: under `causal` the queries
    are the last Tq positions and the first Tk - Tq keys a prefix every query sees (a KV cache).
    key_padding (B, Tk) 1 = real key. state: (S, z) of keys before these. Returns (out, final (S, z))."""
    if q.size(1) != k.size(1) or k.shape[:3] != v.shape[:3] or k.size(2) < q.size(2):
        raise ValueError(f"linear attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not fit "
                         "(B, H, T, d) with equal heads and at least as many keys as queries")
    fq, fk = _features(q, k, key_padding)
    b, h, tq, d = q.shape
    s = fk.new_zeros(b, h, d, v.size(-1)) if state is None else state[0]
    z = fk.new_zeros(b, h, d) if state is None else state[1]
    if not causal:
        s, z = s + fk.transpose(-2, -1) @ v, z + fk.sum(-2)
        return (fq @ s) / ((fq @ z[..., None]) + eps), (s, z)
    prefix = k.size(2) - tq
    if prefix:  # cached keys every query sees: fold them into the state first
        s, z = s + fk[:, :, :prefix].transpose(-2, -1) @ v[:, :, :prefix], z + fk[:, :, :prefix].sum(-2)
        fk, v = fk[:, :, prefix:], v[:, :, prefix:]
    outs = []
    # split, not slices: a slice's backward writes a zero tensor of the whole sequence per chunk (O(T^2 / C))
    for qc, kc, vc in zip(fq.split(chunk, 2), fk.split(chunk, 2), v.split(chunk, 2)):
        inner = (qc @ kc.transpose(-2, -1)).tril()  # phi(q_i).phi(k_j) for j <= i inside the chunk
        num = qc @ s + inner @ vc
        den = (qc @ z[..., None]).squeeze(-1) + inner.sum(-1)
        outs.append(num / (den + eps)[..., None])
        s, z = s + kc.transpose(-2, -1) @ vc, z + kc.sum(-2)
    return torch.cat(outs, 2), (s, z)


def linear_attention_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               state: tuple[torch.Tensor, torch.Tensor] | None = None,
                               key_padding: torch.Tensor | None = None,
                               eps: float = EPS) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Recurrent (RNN) form, one position at a time (§3.4): the causal parallel form's meaning with O(d^2)
    state and work per token. q, k, v (B, H, T, d) new positions; key_padding (B, T) for them."""
    fq, fk = _features(q, k, key_padding)
    b, h, t, d = q.shape
    s = fk.new_zeros(b, h, d, v.size(-1)) if state is None else state[0]
    z = fk.new_zeros(b, h, d) if state is None else state[1]
    outs = []
    for i in range(t):
        s = s + fk[:, :, i, :, None] * v[:, :, i, None, :]
        z = z + fk[:, :, i]
        qi = fq[:, :, i, None]
        outs.append((qi @ s) / ((qi @ z[..., None]) + eps))
    return torch.cat(outs, 2), (s, z)


def linear_attention_weights(q: torch.Tensor, k: torch.Tensor, *, causal: bool,
                             key_padding: torch.Tensor | None = None, eps: float = EPS) -> torch.Tensor:
    """The T x T weights linear attention implies, phi(q_i).phi(k_j) / sum_j (rows sum to ~1), for
    `output_attentions` / viz only: quadratic, never on the compute path."""
    fq, fk = _features(q, k, key_padding)
    w = fq @ fk.transpose(-2, -1)
    if causal:
        w = w.tril(k.size(2) - q.size(2))
    return w / (w.sum(-1, keepdim=True) + eps)


class LinearAttentionCache:
    """Decoding state of a linear-attention model: (S, z) per layer instead of every past key and value.
    Pass it as `past_key_values` (it answers `get_seq_length` as the Encoder asks); memory stays O(d^2) per
    layer and head however long the generation runs."""

    def __init__(self, num_layers: int) -> None:
        self.states: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * num_layers
        self.lengths = [0] * num_layers

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.lengths[layer_idx]

    def attend(self, layer_idx: int, q, k, v, key_padding=None) -> torch.Tensor:
        """These positions' outputs given every earlier one; the state moves past them. A prompt goes
        through the chunked parallel form, single tokens through the recurrence: the same numbers."""
        if not 0 <= layer_idx < len(self.states):
            raise IndexError(f"LinearAttentionCache has {len(self.states)} layers; got layer_idx={layer_idx}")
        if q.size(2) == 1:
            out, state = linear_attention_recurrent(q, k, v, self.states[layer_idx], key_padding)
        else:
            out, state = linear_attention(q, k, v, causal=True, key_padding=key_padding, state=self.states[layer_idx])
        self.states[layer_idx] = state
        self.lengths[layer_idx] += q.size(2)
        return out
