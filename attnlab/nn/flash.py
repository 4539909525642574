"""FlashAttention's algorithm (Dao et al. 2022) written in PyTorch: tiled attention that never holds the
T x T score matrix.

Forward (Alg. 1, in the loop order of FlashAttention-2, Dao 2023): for each block of queries, walk the key/
value blocks keeping a running row max m, a running sum l of exp(s - m) and an unnormalised output acc;
when a new block raises the max, the old sum and output are rescaled by exp(m_old - m_new) (the "online
softmax", Milakov & Gimelshein 2018). At the end out = acc / l and the log-sum-exp L = m + log l is kept:
one number per query.

Backward (Alg. 2 / §3.1.2 "recomputation"): nothing of size T x T was saved, so each tile of
probabilities is recomputed from q, k and L as P = exp(q k^T scale - L), and with D = rowsum(dO * O)
    dV += P^T dO,   dP = dO V^T,   dS = P * (dP - D),   dQ += dS K scale,   dK += dS^T Q scale.
Dropout (§3.1, "we only need to store the pseudo-random number generator state") keeps no mask either:
each tile draws its keep-mask from a generator seeded by (call seed, tile index), and the backward pass
draws the same one again.

Memory is O(T) beyond the inputs (tiles of block_q x block_k); tiles the mask rules out entirely (above
the causal diagonal, outside a sliding window) are skipped, so a windowed layer also costs O(T w) time.
On a GPU the point is fewer HBM reads; here, in eager PyTorch on a CPU, the point is the memory curve and
a readable, tested statement of the algorithm: SDPA stays the faster default (benchmarks/long_attention.py).
"""
from __future__ import annotations

import math

import torch

BLOCK_Q = 128
BLOCK_K = 128


def _tile_mask(mask, qs, qe, ks, ke, tq, tk, device, see_all):
    """The allowed tile (None = all, False = none), with rows that would otherwise see nothing at all
    (`see_all`, (B, H, Tq) bool, or None) opened to every key, as AttentionMask.build does."""
    allowed = mask.block(qs, qe, ks, ke, tq, tk, device) if mask is not None else None
    if see_all is None or allowed is None:
        return allowed
    rows = see_all[:, :, qs:qe, None]
    if not bool(rows.any()):
        return allowed
    return rows if allowed is False else allowed | rows


def _keep_mask(seed, tile, shape, p, device):
    """The dropout keep-mask of one tile, regenerated identically in the backward pass."""
    g = torch.Generator(device=device)
    g.manual_seed(seed * 1_000_003 + tile)
    return torch.rand(shape, generator=g, device=device) >= p


def _acc(x: torch.Tensor) -> torch.Tensor:
    """Accumulate in at least fp32 (bf16/fp16 inputs are upcast per tile; fp64 stays fp64 for gradcheck)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _scores(qi, kj, bias, allowed, qs, qe, ks, ke):
    s = qi @ kj.transpose(-2, -1)
    if bias is not None:
        s = s + _acc(bias[..., qs:qe, ks:ke])
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    return s


def _forward(q, k, v, bias, mask, scale, dropout_p, seed, block_q, block_k, see_all):
    b, h, tq, _ = q.shape
    tk = k.size(2)
    dt = torch.promote_types(q.dtype, torch.float32)
    out = q.new_empty(b, h, tq, v.size(-1))
    lse = torch.empty(b, h, tq, dtype=dt, device=q.device)
    nk = -(-tk // block_k)
    for i, qs in enumerate(range(0, tq, block_q)):
        qe = min(qs + block_q, tq)
        qi = _acc(q[:, :, qs:qe]) * scale
        m = torch.full((b, h, qe - qs), float("-inf"), dtype=dt, device=q.device)
        l = torch.zeros(b, h, qe - qs, dtype=dt, device=q.device)
        acc = torch.zeros(b, h, qe - qs, v.size(-1), dtype=dt, device=q.device)
        for j, ks in enumerate(range(0, tk, block_k)):
            ke = min(ks + block_k, tk)
            allowed = _tile_mask(mask, qs, qe, ks, ke, tq, tk, q.device, see_all)
            if allowed is False:
                continue
            s = _scores(qi, _acc(k[:, :, ks:ke]), bias, allowed, qs, qe, ks, ke)
            m_new = torch.maximum(m, s.amax(-1))
            # a row that has seen no allowed key yet keeps max -inf: shift by 0 so exp gives 0, not NaN
            shift = m_new.masked_fill(m_new == float("-inf"), 0.0)
            p = torch.exp(s - shift[..., None])
            alpha = torch.exp(m - shift)
            l = l * alpha + p.sum(-1)
            if dropout_p > 0:
                p = p * _keep_mask(seed, i * nk + j, p.shape, dropout_p, q.device) / (1 - dropout_p)
            acc = acc * alpha[..., None] + p @ _acc(v[:, :, ks:ke])
            m = m_new
        out[:, :, qs:qe] = (acc / l.clamp(min=torch.finfo(dt).tiny)[..., None]).to(out.dtype)
        lse[:, :, qs:qe] = m + torch.log(l)
    return out, lse


def _backward(q, k, v, bias, mask, scale, dropout_p, seed, block_q, block_k, see_all, out, lse, dout, bias_grad):
    b, h, tq, _ = q.shape
    tk = k.size(2)
    dt = torch.promote_types(q.dtype, torch.float32)
    dq = torch.zeros(q.shape, dtype=dt, device=q.device)
    dk = torch.zeros(k.shape, dtype=dt, device=q.device)
    dv = torch.zeros(v.shape, dtype=dt, device=q.device)
    dbias = torch.zeros(b, h, tq, tk, dtype=dt, device=q.device) if bias_grad else None
    big_d = (_acc(dout) * _acc(out)).sum(-1)  # D_i = rowsum(dO_i * O_i), Alg. 2 line 19 / FA-2 eq. (4)
    nk = -(-tk // block_k)
    for i, qs in enumerate(range(0, tq, block_q)):
        qe = min(qs + block_q, tq)
        qi = _acc(q[:, :, qs:qe]) * scale
        doi = _acc(dout[:, :, qs:qe])
        for j, ks in enumerate(range(0, tk, block_k)):
            ke = min(ks + block_k, tk)
            allowed = _tile_mask(mask, qs, qe, ks, ke, tq, tk, q.device, see_all)
            if allowed is False:
                continue
            kj, vj = _acc(k[:, :, ks:ke]), _acc(v[:, :, ks:ke])
            p = torch.exp(_scores(qi, kj, bias, allowed, qs, qe, ks, ke) - lse[:, :, qs:qe, None])
            dp = doi @ vj.transpose(-2, -1)
            if dropout_p > 0:
                keep = _keep_mask(seed, i * nk + j, p.shape, dropout_p, q.device) / (1 - dropout_p)
                dv[:, :, ks:ke] += (p * keep).transpose(-2, -1) @ doi
                dp = dp * keep
            else:
                dv[:, :, ks:ke] += p.transpose(-2, -1) @ doi
            ds = p * (dp - big_d[:, :, qs:qe, None])
            if dbias is not None:
                dbias[:, :, qs:qe, ks:ke] = ds
            dq[:, :, qs:qe] += (ds @ kj) * scale
            dk[:, :, ks:ke] += ds.transpose(-2, -1) @ qi  # qi already carries the scale
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dbias


class TiledAttention(torch.autograd.Function):
    """softmax(q k^T scale + bias, masked) v, tiled; saves q, k, v, out and the log-sum-exp only."""

    @staticmethod
    def forward(ctx, q, k, v, bias, mask, scale, dropout_p, block_q, block_k):
        seed = int(torch.randint(0, 2**31 - 1, (1,)).item()) if dropout_p > 0 else 0
        out, lse = _forward(q, k, v, bias, mask, scale, dropout_p, seed, block_q, block_k, None)
        see_all = None
        if mask is not None and bool((lse == float("-inf")).any()):
            # some query may see no key at all (left padding under a causal mask): let it see every key
            # instead, as the dense mask does, and run again with those rows opened
            see_all = lse == float("-inf")
            out, lse = _forward(q, k, v, bias, mask, scale, dropout_p, seed, block_q, block_k, see_all)
        ctx.save_for_backward(q, k, v, bias, out, lse, see_all)
        ctx.config = (mask, scale, dropout_p, seed, block_q, block_k)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, bias, out, lse, see_all = ctx.saved_tensors
        mask, scale, dropout_p, seed, block_q, block_k = ctx.config
        bias_grad = bias is not None and ctx.needs_input_grad[3]
        dq, dk, dv, dbias = _backward(q, k, v, bias, mask, scale, dropout_p, seed, block_q, block_k, see_all,
                                      out, lse, dout.contiguous(), bias_grad)
        if dbias is not None:
            dbias = dbias.sum_to_size(bias.shape).to(bias.dtype)
        return dq, dk, dv, dbias, None, None, None, None, None


def tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask=None, bias: torch.Tensor | None = None,
                    scale: float | None = None, dropout_p: float = 0.0, block_q: int = BLOCK_Q,
                    block_k: int = BLOCK_K) -> torch.Tensor:
    """q (B, H, Tq, d), k/v (B, H, Tk, d) (repeat GQA heads before calling); `mask` an AttentionMask (its
    `block()` gives one tile), `bias` broadcastable to (B, H, Tq, Tk). Returns (B, H, Tq, d_v)."""
    if q.size(1) != k.size(1) or k.shape[:3] != v.shape[:3] or q.size(-1) != k.size(-1):
        raise ValueError(f"tiled attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not "
                         "fit (B, H, T, d) with equal heads (repeat key/value heads for GQA first)")
    if block_q <= 0 or block_k <= 0:
        raise ValueError(f"tiled attention: block sizes must be positive, got {block_q} x {block_k}")
    scale = 1 / math.sqrt(q.size(-1)) if scale is None else scale
    return TiledAttention.apply(q, k, v, bias, mask, scale, dropout_p, block_q, block_k)
