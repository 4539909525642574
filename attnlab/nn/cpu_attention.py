"""Attention over short sequences on a CPU, in our own kernel (`csrc/short_attention.c`): same values as
`F.scaled_dot_product_attention` (fp32 rounding, exp to ~1 ulp), for the case an encoder over sentences
spends its attention time in: no gradient, fp32, key padding or no mask, at most `MAX_KEYS` keys.

Measured on all-MiniLM-L6-v2 over 1,024 length-sorted SST-2/CoNLL sentences (one thread, AVX-512): the
attention of the 6 layers took 320 ms in torch's flash kernel, whose per-head overhead dominates at
T ~ 10-60; see the kernel's header for how one head is computed. Threads: the (batch, head) pairs are split
over torch's intra-op thread count (ctypes releases the GIL while a call runs).
"""
from __future__ import annotations

import ctypes

import torch

from .fused import usable
from .quantized import kernels, split_rows

MAX_KEYS = 128       # beyond it torch's flash kernel (key blocks, no per-head padding) is as fast
_MAX_TILE = 16384    # the kernel's stack tile: head_dim x keys padded to 16


def _supported(lib) -> bool:
    return lib is not None and bool(lib.short_attention_supported())


def short_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None,
                    scale: float) -> torch.Tensor | None:
    """q (B, Hq, Tq, D), k/v (B, Hk, Tk, D), keep (B, Tk) bool (True = real key) or None. Returns
    (B, Hq, Tq, D) (a transposed view of a (B, Tq, Hq, D) tensor), or None when this case is not the
    kernel's (then use F.scaled_dot_product_attention)."""
    b, hq, tq, d = q.shape
    hk, tk = k.size(1), k.size(2)
    if (q.device.type != "cpu" or not q.dtype == k.dtype == v.dtype == torch.float32 or tk > MAX_KEYS or tk == 0
            or d % 16 or d > 128 or d * ((tk + 15) // 16 * 16) > _MAX_TILE or hq % hk
            or any(t.stride(-1) != 1 for t in (q, k, v))
            or (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)))
            or torch.jit.is_tracing()):  # a trace (e.g. for ONNX) could not see the C call
        return None
    lib = kernels()
    if not _supported(lib):
        return None
    if keep is not None:
        keep = (keep | ~keep.any(-1, keepdim=True)).to(torch.uint8).contiguous()  # a row of no keys sees all
    out = torch.empty(b, tq, hq, d, dtype=torch.float32)
    strides = [(ctypes.c_int64 * 3)(t.stride(0), t.stride(1), t.stride(2)) for t in (q, k, v)]
    args = (q.data_ptr(), strides[0], k.data_ptr(), strides[1], v.data_ptr(), strides[2], b, hq, hk, tq, tk, d,
            None if keep is None else keep.data_ptr(), float(scale), out.data_ptr())
    split_rows(lambda start, end: lib.short_attention(*args, start, end), b * hq)
    return out.transpose(1, 2)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor | None:
    """Causal self-attention, bf16, in one kernel (`csrc/causal_attention.c`, AVX512-BF16 dot products): q
    (B, H, T, D), k / v (B, Hk, T, D), D 64 or 128, H a multiple of Hk, each with its last dimension
    contiguous. Returns (B, H, T, D) (a transposed view of a (B, T, H, D) tensor), or None when the case or
    the CPU is not the kernel's (then use torch's). Measured on SmolLM2-135M, 4 x 512-token windows, one
    thread: see the README's `evaluate lm` table (the side attnlab-kept-bf16-unfused runs without it)."""
    b, h, t, d = q.shape
    hk = k.size(1)
    if (not q.dtype == k.dtype == v.dtype == torch.bfloat16 or d not in (64, 128) or k.shape != v.shape
            or k.dim() != 4 or (k.size(0), k.size(2), k.size(3)) != (b, t, d) or h % hk
            or any(x.stride(-1) != 1 or type(x) is not torch.Tensor or x.device.type != "cpu" for x in (k, v))):
        return None
    lib = usable(q, contiguous=False)  # the conditions every C kernel shares (no grad, compile, trace...)
    if lib is None or not lib.causal_attention_supported():
        return None
    out = torch.empty(b, t, h, d, dtype=torch.bfloat16).transpose(1, 2)
    strides = [(ctypes.c_int64 * 3)(*x.stride()[:3]) for x in (q, k, v, out)]
    args = (q.data_ptr(), strides[0], k.data_ptr(), strides[1], v.data_ptr(), strides[2], out.data_ptr(),
            strides[3], h, hk, t, d, float(scale))
    failed: list[int] = []
    split_rows(lambda start, end: failed.append(lib.causal_attention_bf16(*args, start, end)), b * hk)
    return None if any(failed) else out
