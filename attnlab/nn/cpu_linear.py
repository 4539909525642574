"""Linear layers of an encoder at inference on a CPU through oneDNN with the weights packed once in its
blocked layout (`torch.ops.mkldnn`, what inductor's freezing uses), the FFN's GELU fused into the product.

Measured on all-MiniLM-L6-v2's shapes (520 x 384 @ 384 x 1536 and the others, one thread, AVX512): 94-104
GFLOP/s for torch's addmm, 102-109 packed (on an AVX2-only CPU packed is the slower: `packed_is_faster`); GELU fused saves its own pass over the widest activation (up + GELU:
9.6 -> 6.3 ms). ONNX Runtime's MLAS runs these GEMMs at ~100 GFLOP/s, which is why its fp32 encoder was
ahead. The packed copy costs one more copy of each weight, so it is used for encoders only (a decoder's
batch-1 steps are memory-bound, and the copy would double its footprint). Same values to fp32 rounding
(another summation order). Anything else (training, another dtype or device, a module with hooks, a
compiled graph) takes the plain path: these functions return None.
"""
from __future__ import annotations

import weakref

import torch
from torch import nn

from .precision import cpu_flags

# owner module -> {key: (weight stamp, packed weight)}; outside the modules, so that deepcopy, pickling and
# state dicts never meet the opaque oneDNN tensors, and a packed copy goes with its module
_PACKED: "weakref.WeakKeyDictionary[nn.Module, dict]" = weakref.WeakKeyDictionary()

# our activation names -> oneDNN's post-op (attr, algorithm)
POST_OPS = {None: ("none", ""), "gelu": ("gelu", "none"), "gelu_tanh": ("gelu", "tanh"), "relu": ("relu", "")}


def packed_is_faster(flags: set[str] | None = None) -> bool:
    """Whether this CPU runs the packed products faster than torch's addmm. Measured on MiniLM's shapes, one
    thread: an AVX512 Xeon 102-109 GFLOP/s packed against 94-104; an AVX2-only AMD EPYC 72-75 packed against
    84-89 for addmm, and its fused GELU no faster than GELU after the product. So: where AVX512 is."""
    return "avx512f" in (cpu_flags() if flags is None else flags)


ENABLED = packed_is_faster()


def _usable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (ENABLED and x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
            and not torch.is_grad_enabled() and not torch.compiler.is_compiling()
            and torch.backends.mkldnn.is_available())


def packed_linear(owner: nn.Module, key: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  activation: str | None = None) -> torch.Tensor | None:
    """activation(x W^T + b) with W packed once and kept in `owner` (under `key`) until W changes, or None
    when this case is not for oneDNN (see the module's docstring)."""
    if activation not in POST_OPS or not _usable(x, weight):
        return None
    stamp = (weight.data_ptr(), -1 if weight.is_inference() else weight._version, tuple(weight.shape))
    cache = _PACKED.setdefault(owner, {})
    if key not in cache or cache[key][0] != stamp:
        cache[key] = (stamp, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None))
    attr, algorithm = POST_OPS[activation]
    return torch.ops.mkldnn._linear_pointwise(x, cache[key][1], bias, attr, [], algorithm)


def unhooked(m: nn.Module) -> bool:
    """No forward hook (its own or a global one) must see `m` called: a fused product may stand in for it."""
    return (not m._forward_hooks and not m._forward_pre_hooks
            and not nn.modules.module._global_forward_hooks and not nn.modules.module._global_forward_pre_hooks)


def plain_module(m: nn.Module) -> bool:
    """An nn.Linear exactly, with no hooks that must see it called."""
    return type(m) is nn.Linear and unhooked(m)


def module_linear(m: nn.Module, x: torch.Tensor, activation: str | None = None) -> torch.Tensor | None:
    return packed_linear(m, "weight", x, m.weight, m.bias, activation) if plain_module(m) else None


def forget_packed(*modules: nn.Module) -> None:
    """Drop packed copies: called at every train()/eval() switch, since a fused optimizer step updates weights
    in place without bumping the version the cache is keyed on."""
    for m in modules:
        _PACKED.pop(m, None)
