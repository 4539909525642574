"""Dropout (Srivastava et al. 2014) for training on a CPU in one pass (`csrc/dropout.c`), and the `Dropout`
module every block, embedding and attention layer uses.

torch draws a CPU dropout mask with `bernoulli_` (~8-11 ns an element) and multiplies in a second pass;
fine-tuning MiniLM on sentence pairs spent ~6% of each step drawing masks. The kernel hashes each element's
position with a seed drawn from torch's generator (so `torch.manual_seed` still fixes a run, and a resumed run
draws what the uninterrupted one drew) and applies the mask in the same pass; the backward pass recomputes the
mask from the seed, so nothing of the size of the activations is kept for it. The masks differ from torch's
(another generator), not their law: each element kept with probability 1 - p, kept ones scaled by 1 / (1 - p).

The kernel runs for CPU tensors of fp32 or bf16 outside torch.compile, torch.export and jit traces (which could
not see a C call), and when `ATTNLAB_FUSED=0` is not set; elsewhere `F.dropout` does the work.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from . import kernels

_MIN_ELEMENTS = 1 << 12  # below, the ctypes call costs more than torch's two passes
_CHUNK = 1 << 16          # elements per thread at least
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def applies(x: torch.Tensor) -> bool:
    """Whether `dropout(x, p)` runs on the C kernel (see the module doc)."""
    return (x.device.type == "cpu" and x.dtype in (torch.float32, torch.bfloat16) and x.numel() >= _MIN_ELEMENTS
            and type(x) in _PLAIN and x.dim() >= 1 and x.size(-1) > 0
            and not (torch.compiler.is_compiling() or torch.compiler.is_exporting() or torch.jit.is_tracing())
            and os.environ.get("ATTNLAB_FUSED") != "0" and kernels.active("dropout"))


def _apply(x: torch.Tensor, seed: int, p: float) -> torch.Tensor:
    """x with the mask of `seed` applied (kept elements scaled by 1 / (1 - p))."""
    x = x.contiguous()
    out = torch.empty_like(x)
    cols = x.size(-1)
    threshold = min(int(round(p * 2.0 ** 32)), 2 ** 32 - 1)
    kernels.call("dropout_rows", x, out, cols, seed, threshold, 1.0 / (1.0 - p), int(x.dtype == torch.bfloat16),
                 min_rows=max(1, _CHUNK // cols))
    return out


class _HashedDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float, seed: int) -> torch.Tensor:
        ctx.p, ctx.seed = p, seed
        return _apply(x, seed, p)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _apply(grad, ctx.seed, ctx.p), None, None


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """`F.dropout(x, p, training)`, on the C kernel where it applies (see the module doc)."""
    if not training or p == 0.0:
        return x
    if not 0.0 < p < 1.0 or not applies(x):
        return F.dropout(x, p, training)
    seed = int(torch.randint(0, 2 ** 62, (), dtype=torch.int64))
    return _HashedDropout.apply(x, p, seed)


class Dropout(nn.Dropout):
    """`nn.Dropout` (same name, same state: none) whose training pass runs on the C kernel where it applies."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inplace:
            return super().forward(x)
        return dropout(x, self.p, self.training)
