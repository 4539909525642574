"""RMSNorm, the SiLU gate and (bf16) rotary embeddings in one pass each (`csrc/fused_rows.c`), for inference
on a CPU.

torch runs `F.rms_norm` on a CPU as a composite of pow, mean, rsqrt, multiplies and casts, `silu(g) * u` as two
passes and RoPE as six: on SmolLM2-135M in bf16 over 4 x 1,024-token windows they took ~11% of `evaluate lm`'s
time, each pass reading and writing every activation. The kernels do the same arithmetic in the same order (see
the C file's header for where the last bit may differ). They run only where nothing else could be watching: CPU
tensors of fp32 or bf16, no gradient wanted, no autocast, not inside torch.compile, torch.export or a jit trace
(they could not see a C call). Otherwise each function returns None and the caller runs the torch ops.
ATTNLAB_FUSED=0 turns them off (to tell whether a difference in the last bits comes from them).
"""
from __future__ import annotations

import os

import torch

from . import kernels

_MIN_ELEMENTS = 1 << 14  # below, the ctypes call costs more than the pass it saves
_CHUNK = 1 << 16          # elements per thread at least
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def usable(x: torch.Tensor, *others: torch.Tensor, contiguous: bool = True, kernel: str = "fused_rows") -> bool:
    """Whether `x` and `others` qualify (see the module doc) and `kernel` runs here. `others` must be CPU
    tensors of x's dtype (or fp32), contiguous; x too unless contiguous=False (then its last dimension)."""
    if (x.device.type != "cpu" or x.dtype not in (torch.float32, torch.bfloat16) or x.numel() < _MIN_ELEMENTS
            or torch.is_grad_enabled() or torch.is_autocast_enabled("cpu") or torch.compiler.is_compiling()
            or torch.compiler.is_exporting() or torch.jit.is_tracing() or os.environ.get("ATTNLAB_FUSED") == "0"):
        return False
    if type(x) not in _PLAIN or not (x.is_contiguous() if contiguous else x.stride(-1) == 1):
        return False  # (a FakeTensor or another subclass may have no memory to hand to C)
    if any(type(t) not in _PLAIN or t.device.type != "cpu" or t.dtype not in (x.dtype, torch.float32)
           or not t.is_contiguous() for t in others):
        return False
    return kernels.active(kernel)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor | None:
    """silu(gate) * up, or None when the kernel does not apply. (A new tensor, not written into `gate`: a
    forward hook may hold on to the gate's output.)"""
    if gate.shape != up.shape or up.dtype != gate.dtype or not usable(gate, up):
        return None
    out = torch.empty_like(gate)
    kernels.call("silu_mul_rows", gate, up, out, int(gate.dtype == torch.bfloat16), min_rows=_CHUNK)
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    """weight * round(x / sqrt(mean(x^2, -1) + eps)) over the last dimension, or None when the kernel does
    not apply."""
    if weight.dim() != 1 or x.size(-1) != weight.numel() or weight.dtype != x.dtype or not usable(x, weight):
        return None
    out = torch.empty_like(x)
    cols = x.size(-1)
    kernels.call("rms_norm_rows", x, weight, out, cols, float(eps), int(x.dtype == torch.bfloat16),
                 min_rows=max(1, _CHUNK // cols))
    return out


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor | None:
    """x * cos + rotate_half(x) * sin for bf16 x (B, H, T, D) (any strides, the last dimension contiguous) and
    cos / sin (B or 1, 1, T, D), or None when the kernel does not apply (e.g. partial rotary). The result
    has x's layout when x is dense (a (B, T, H, D) buffer seen as (B, H, T, D) stays one)."""
    if x.dtype != torch.bfloat16 or x.dim() != 4 or cos.shape != sin.shape or cos.dim() != 4 or cos.size(1) != 1:
        return None  # (fp32: measured no faster than torch's ops)
    b, h, t, d = x.shape
    if (x.stride(-1) != 1 or d % 2 or tuple(cos.shape[2:]) != (t, d) or cos.size(0) not in (1, b)
            or cos.dtype != sin.dtype or cos.dtype not in (torch.float32, x.dtype)):
        return None
    if not usable(x, cos, sin, contiguous=False):
        return None
    out = torch.empty_like(x)  # preserve_format: x's layout when x is dense, else contiguous
    kernels.call("rope_rows", x, cos, sin, t * d if cos.size(0) > 1 else 0, int(cos.dtype == torch.bfloat16),
                 out, h, t, d, int(x.dtype == torch.bfloat16), min_rows=max(1, _CHUNK // d))
    return out


def lse_tile(logits: torch.Tensor, targets: torch.Tensor, v0: int, run_max: torch.Tensor, run_sum: torch.Tensor,
             picked: torch.Tensor) -> bool:
    """One vocabulary tile of a log-softmax, in place: fold the tile's logits (n, cols) into each row's running
    max `run_max` and sum `run_sum` of e^(logit - max) (fp32, (n,)), and copy the logit of `targets` (int64)
    into `picked` where it falls in columns [v0, v0 + cols). False (nothing done) when the kernel does not
    apply; then the caller folds the tile in with torch's ops."""
    n = logits.size(0) if logits.dim() == 2 else -1
    if (n < 1 or not usable(logits) or targets.dtype != torch.int64 or not targets.is_contiguous()
            or any(t.dtype != torch.float32 or not t.is_contiguous() or t.device.type != "cpu"
                   for t in (run_max, run_sum, picked)) or not all(t.numel() == n for t in (targets, run_max,
                                                                                            run_sum, picked))):
        return False
    cols = logits.size(1)
    kernels.call("lse_tile_rows", logits, cols, int(logits.dtype == torch.bfloat16), targets, int(v0), run_max,
                 run_sum, picked, min_rows=max(1, _CHUNK // cols))
    return True
