"""Position-wise feed-forward network: FFN(x) = W2 act(W1 x) (Vaswani et al. 2017, §3.3),
and the gated variants GeGLU / SwiGLU (Shazeer 2020): FFN(x) = W2 (act(Wg x) * (W1 x))."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from . import fused
from .cpu_linear import forget_packed, module_linear
from .int8 import Int8Linear


def activation_fn(name: str):
    return {
        "relu": F.relu,
        "gelu": F.gelu,                                       # exact erf form, as BERT
        "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),  # GPT-2's "gelu_new"
        "silu": F.silu,
        "geglu": F.gelu,
        "geglu_tanh": lambda x: F.gelu(x, approximate="tanh"),  # T5 v1.1's "gated-gelu" (gelu_new)
        "swiglu": F.silu,
        "leaky_relu": F.leaky_relu,                           # slope 0.01 below zero, as torch / transformers
        "tanh": torch.tanh,                                   # BERT's pooler
    }[name]


class FeedForward(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d, inner = config.hidden_size, config.intermediate_size
        self.up = nn.Linear(d, inner, bias=config.bias)
        # Gated variants spend a third matrix on the gate; inner size stays what the config says.
        self.gate = nn.Linear(d, inner, bias=config.bias) if config.is_glu else None
        self.down = nn.Linear(inner, d, bias=config.bias)
        self.act = activation_fn(config.activation)
        self.activation = config.activation
        self.pack = not config.causal  # encoders: oneDNN-packed products at CPU inference (nn/cpu_linear.py)

    def train(self, mode: bool = True) -> "FeedForward":
        forget_packed(self.up, self.down)  # see nn/cpu_linear.py
        return super().train(mode)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pack and self.gate is None:
            h = module_linear(self.up, x, self.activation)  # the activation fused into the product
            if h is not None:
                out = module_linear(self.down, h)
                return out if out is not None else self.down(h)
        if self.gate is None and self.activation == "gelu" and type(self.up) is Int8Linear:
            return self.down(self.up(x, activation="gelu"))  # GELU in the int8 product's store (nn/int8.py)
        if self.gate is not None:
            g = self.gate(x)
            if self.activation in ("silu", "swiglu"):  # SwiGLU at inference on a CPU: one pass (nn/fused.py)
                u = self.up(x)
                h = fused.silu_mul(g, u)
                return self.down(h if h is not None else self.act(g) * u)
            return self.down(self.act(g) * self.up(x))
        return self.down(self.act(self.up(x)))
