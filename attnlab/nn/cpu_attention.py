"""Attention over short sequences on a CPU, in our own kernel (`csrc/short_attention.c`): same values as
`F.scaled_dot_product_attention` (fp32 rounding, exp to ~1 ulp), for the case an encoder over sentences
spends its attention time in: no gradient, fp32, key padding or no mask, at most `MAX_KEYS` keys.

Measured on all-MiniLM-L6-v2 over 1,024 length-sorted SST-2/CoNLL sentences (one thread): the attention of
the 6 layers took 320 ms (AVX-512) and 490 ms (AVX2, Zen 3) in torch's flash kernel, whose per-head overhead
dominates at T ~ 10-60; see the kernel's header for how one head is computed (AVX-512, or AVX2 + FMA). Threads: the (batch, head) pairs are split
over torch's intra-op thread count (ctypes releases the GIL while a call runs).
"""
from __future__ import annotations

import os

import torch

from . import kernels
from .fused import usable

MAX_KEYS = 128       # beyond it torch's flash kernel (key blocks, no per-head padding) is as fast
_MAX_TILE = 16384    # the kernel's stack tile: head_dim x keys padded to 16


def rows_see_a_key(keep: torch.Tensor) -> torch.Tensor:
    """Boolean `keep` (..., Tk) with every row that keeps no key made to keep all of them: such a row (a padding
    query under a causal mask, a batch row of padding only) would get NaN from an empty softmax, and its output
    is padding that nothing reads."""
    return keep | ~keep.any(-1, keepdim=True)


def short_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None,
                    scale: float) -> torch.Tensor | None:
    """q (B, Hq, Tq, D), k/v (B, Hk, Tk, D), keep (B, Tk) or (1, Tk) bool (True = real key) or None. Returns
    (B, Hq, Tq, D) (a transposed view of a (B, Tq, Hq, D) tensor), or None when this case is not the
    kernel's (then use F.scaled_dot_product_attention, which also broadcasts what the kernel does not)."""
    if q.dim() != 4 or k.dim() != 4:
        return None
    b, hq, tq, d = q.shape
    hk, tk = k.size(1), k.size(2)
    if (q.device.type != "cpu" or not q.dtype == k.dtype == v.dtype == torch.float32 or tk > MAX_KEYS or tk == 0
            or d % 16 or d > 128 or d * ((tk + 15) // 16 * 16) > _MAX_TILE or hq % hk
            or k.shape != (b, hk, tk, d) or v.shape != k.shape  # k/v of another batch: SDPA broadcasts them
            or any(t.stride(-1) != 1 or t.device.type != "cpu" for t in (q, k, v))
            or (keep is not None and (keep.dim() != 2 or keep.size(0) not in (1, b) or keep.size(1) != tk))
            or (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)))
            or torch.jit.is_tracing()):  # a trace (e.g. for ONNX) could not see the C call
        return None
    if not kernels.active("short_attention"):
        return None
    if keep is not None:
        # one (1, Tk) mask serves every batch row
        keep = rows_see_a_key(keep.to(torch.bool)).expand(b, tk).to(torch.uint8).contiguous()
    out = torch.empty(b, tq, hq, d, dtype=torch.float32)
    kernels.call("short_attention", q, k, v, b, hq, hk, tq, tk, d, keep, float(scale), out)
    return out.transpose(1, 2)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor | None:
    """Causal self-attention, bf16, in one kernel (`csrc/causal_attention.c`, AVX512-BF16 dot products): q
    (B, H, T, D), k / v (B, Hk, T, D), D 64 or 128, H a multiple of Hk, each with its last dimension
    contiguous. Returns (B, H, T, D) (a transposed view of a (B, T, H, D) tensor), or None when the case or
    the CPU is not the kernel's (then use torch's). Measured on SmolLM2-135M, 4 x 512-token windows, one
    thread: see docs/research/perplexity.md (the side attnlab-kept-bf16-unfused runs without it)."""
    if q.dim() != 4:
        return None
    b, h, t, d = q.shape
    hk = k.size(1)
    if (not q.dtype == k.dtype == v.dtype == torch.bfloat16 or d not in (64, 128) or k.shape != v.shape
            or k.dim() != 4 or (k.size(0), k.size(2), k.size(3)) != (b, t, d) or h % hk
            or any(x.stride(-1) != 1 or type(x) is not torch.Tensor or x.device.type != "cpu" for x in (k, v))):
        return None
    if not usable(q, contiguous=False, kernel="causal_attention"):
        return None  # (usable: the conditions every C kernel shares: no grad, compile, trace...)
    out = torch.empty(b, t, h, d, dtype=torch.bfloat16).transpose(1, 2)
    try:
        kernels.call("causal_attention_bf16", q, k, v, out, h, hk, t, d, float(scale))
    except RuntimeError:  # the kernel's scratch memory could not be had: nothing written, torch's path
        return None
    return out


def paged_decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor,
                           offsets: torch.Tensor, scale: float) -> torch.Tensor | None:
    """One decoding step's attention read in place from a paged KV pool (`csrc/paged_attention.c`): q
    (B, Hq, 1, D) fp32; keys / values (S, Hk, D) fp32 or fp16, the pool's slots; row b attends to the slots
    slots[offsets[b]:offsets[b + 1]] (int64). Returns (B, Hq, 1, D), or None when the case or the machine
    is not the kernel's (then gather the keys and use SDPA)."""
    if q.dim() != 4 or keys.dim() != 3:
        return None
    b, hq, t, d = q.shape
    s, hk = keys.size(0), keys.size(1)
    if (t != 1 or q.dtype != torch.float32 or keys.dtype != values.dtype
            or keys.dtype not in (torch.float32, torch.float16) or keys.shape != values.shape
            or keys.size(2) != d or d % 16 or hk == 0 or hq % hk or hq // hk * d > 4096
            or any(type(x) not in (torch.Tensor, torch.nn.Parameter) or x.device.type != "cpu"
                   for x in (q, keys, values, slots, offsets))
            or not keys.is_contiguous() or not values.is_contiguous()
            or torch.is_grad_enabled() or torch.compiler.is_compiling() or torch.jit.is_tracing()
            or os.environ.get("ATTNLAB_FUSED") == "0" or not kernels.active("paged_attention")):
        return None
    out = torch.empty(b, hq, 1, d, dtype=torch.float32)
    fn = "paged_decode_attention" if keys.dtype == torch.float32 else "paged_decode_attention_f16"
    kernels.call(fn, q.contiguous(), keys, values, s, b, hq, hk, d, slots, offsets,
                 slots.numel(), float(scale), out)
    return out
