"""Building blocks, each a small file: attention, positions, norms, feed-forward, embeddings, block.

The names below load on first use (PEP 562): `attnlab.nn.precision` and `attnlab.nn.kernel_build` import no
torch, so the torch-free decoder (inference/lean.py) can build and load the C kernels without it."""
from __future__ import annotations

from ..lazy import lazy_getattr

_WHERE = {
    "Attention": ".attention", "AttentionMask": ".attention", "scaled_dot_product_attention": ".attention",
    "Block": ".block", "Embeddings": ".embeddings", "FeedForward": ".feedforward", "RMSNorm": ".norms",
    "make_norm": ".norms", "RelativePositionBias": ".positions", "RotaryEmbedding": ".positions",
    "apply_rotary": ".positions", "sinusoidal_table": ".positions",
}

__all__ = ["Attention", "AttentionMask", "Block", "Embeddings", "FeedForward", "RMSNorm", "RelativePositionBias",
           "RotaryEmbedding", "apply_rotary", "make_norm", "scaled_dot_product_attention", "sinusoidal_table"]


__getattr__ = lazy_getattr(__name__, _WHERE, globals())


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
