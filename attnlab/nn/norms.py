"""LayerNorm (Ba et al. 2016) and RMSNorm (Zhang & Sennrich 2019, used by T5 and LLaMA)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from . import fused


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight: LayerNorm without centring and without bias."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == self.weight.dtype and not torch.is_grad_enabled() and not torch.is_autocast_enabled():
            out = fused.rms_norm(x, self.weight, self.eps)  # one pass on a CPU (nn/fused.py), else torch's
            if out is not None:
                return out
            # inference: torch's kernel (fp32 accumulation for bf16 too) without the fp32 copy of x: ~25% less
            # norm time on a bf16 model. It rounds w * x / rms once, where the path below (transformers') rounds
            # x / rms to bf16 before the weight multiplies it: bf16 results may differ in the last bit.
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        # Normalise in fp32 even under bf16 autocast: the mean of squares loses precision otherwise.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def make_norm(config: ModelConfig, dim: int | None = None) -> nn.Module:
    dim = dim or config.hidden_size
    if config.norm == "rmsnorm":
        return RMSNorm(dim, eps=config.norm_eps)
    return nn.LayerNorm(dim, eps=config.norm_eps, bias=config.bias)
