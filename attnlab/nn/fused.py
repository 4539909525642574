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

import ctypes
import os

import torch

from .quantized import kernels, split_rows

_MIN_ELEMENTS = 1 << 14  # below, the ctypes call costs more than the pass it saves
_CHUNK = 1 << 16          # elements per thread at least
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def usable(x: torch.Tensor, *others: torch.Tensor, contiguous: bool = True):
    """The kernel library when `x` and `others` qualify (see the module doc), else None. `others` must be CPU
    tensors of x's dtype (or fp32), contiguous; x too unless contiguous=False (then its last dimension)."""
    if (x.device.type != "cpu" or x.dtype not in (torch.float32, torch.bfloat16) or x.numel() < _MIN_ELEMENTS
            or torch.is_grad_enabled() or torch.is_autocast_enabled("cpu") or torch.compiler.is_compiling()
            or torch.compiler.is_exporting() or torch.jit.is_tracing() or os.environ.get("ATTNLAB_FUSED") == "0"):
        return None
    if type(x) not in _PLAIN or not (x.is_contiguous() if contiguous else x.stride(-1) == 1):
        return None  # (a FakeTensor or another subclass may have no memory to hand to C)
    if any(type(t) not in _PLAIN or t.device.type != "cpu" or t.dtype not in (x.dtype, torch.float32)
           or not t.is_contiguous() for t in others):
        return None
    return kernels()


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor | None:
    """silu(gate) * up, or None when the kernel does not apply. (A new tensor, not written into `gate`: a
    forward hook may hold on to the gate's output.)"""
    lib = usable(gate, up)
    if lib is None or gate.shape != up.shape or up.dtype != gate.dtype:
        return None
    out = torch.empty_like(gate)
    args = (gate.data_ptr(), up.data_ptr(), out.data_ptr(), int(gate.dtype == torch.bfloat16))
    split_rows(lambda start, end: lib.silu_mul_rows(*args, start, end), gate.numel(), _CHUNK)
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    """weight * round(x / sqrt(mean(x^2, -1) + eps)) over the last dimension, or None when the kernel does
    not apply."""
    lib = usable(x, weight)
    if lib is None or weight.dim() != 1 or x.size(-1) != weight.numel() or weight.dtype != x.dtype:
        return None
    out = torch.empty_like(x)
    cols = x.size(-1)
    args = (x.data_ptr(), weight.data_ptr(), out.data_ptr(), cols, float(eps), int(x.dtype == torch.bfloat16))
    split_rows(lambda start, end: lib.rms_norm_rows(*args, start, end), x.numel() // cols, max(1, _CHUNK // cols))
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
    lib = usable(x, cos, sin, contiguous=False)
    if lib is None:
        return None
    out = torch.empty_like(x)  # preserve_format: x's layout when x is dense, else contiguous
    xs, os_ = ((ctypes.c_int64 * 3)(*y.stride()[:3]) for y in (x, out))
    args = (x.data_ptr(), xs, cos.data_ptr(), sin.data_ptr(), t * d if cos.size(0) > 1 else 0,
            int(cos.dtype == torch.bfloat16), out.data_ptr(), os_, h, t, d, int(x.dtype == torch.bfloat16))
    split_rows(lambda start, end: lib.rope_rows(*args, start, end), b * h * t, max(1, _CHUNK // d))
    return out


def lse_tile(logits: torch.Tensor, targets: torch.Tensor, v0: int, run_max: torch.Tensor, run_sum: torch.Tensor,
             picked: torch.Tensor) -> bool:
    """One vocabulary tile of a log-softmax, in place: fold the tile's logits (n, cols) into each row's running
    max `run_max` and sum `run_sum` of e^(logit - max) (fp32, (n,)), and copy the logit of `targets` (int64)
    into `picked` where it falls in columns [v0, v0 + cols). False (nothing done) when the kernel does not
    apply; then the caller folds the tile in with torch's ops."""
    lib = usable(logits)
    n = logits.size(0) if logits.dim() == 2 else -1
    if (lib is None or n < 1 or targets.dtype != torch.int64 or not targets.is_contiguous()
            or any(t.dtype != torch.float32 or not t.is_contiguous() or t.device.type != "cpu"
                   for t in (run_max, run_sum, picked)) or not all(t.numel() == n for t in (targets, run_max,
                                                                                            run_sum, picked))):
        return False
    cols = logits.size(1)
    args = (logits.data_ptr(), cols, int(logits.dtype == torch.bfloat16), targets.data_ptr(), v0,
            run_max.data_ptr(), run_sum.data_ptr(), picked.data_ptr())
    split_rows(lambda start, end: lib.lse_tile_rows(*args, start, end), n, max(1, _CHUNK // cols))
    return True
