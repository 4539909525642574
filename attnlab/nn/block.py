"""One Transformer block: self-attention, optional cross-attention, feed-forward, each wrapped in a
residual connection and a norm, placed either after (post-LN, the original Transformer and BERT:
LN(x + f(x))) or before (pre-LN, GPT-2 onwards: x + f(LN(x)); Xiong et al. 2020 show it trains without
warmup)."""
from __future__ import annotations

import torch
from torch import nn

from ..config import ModelConfig
from .attention import Attention, AttentionMask
from .dropout import Dropout
from .feedforward import FeedForward
from .moe import MoEFeedForward
from .norms import make_norm
from .relative_xl import from_positions, to_positions


class Block(nn.Module):
    def __init__(self, config: ModelConfig, cross_attention: bool = False) -> None:
        super().__init__()
        self.pre = config.norm_placement == "pre"
        self.parallel = config.parallel_residual
        self.attn = Attention(config)
        self.attn_norm = make_norm(config)
        self.cross_attn = Attention(config, cross=True) if cross_attention else None
        self.cross_norm = make_norm(config) if cross_attention else None
        self.ffn = MoEFeedForward(config) if config.num_experts else FeedForward(config)  # Mixtral: routed experts
        self.ffn_norm = make_norm(config)
        self.dropout = Dropout(config.dropout)

    def _residual(self, x: torch.Tensor, norm: nn.Module, sublayer) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.pre:
            h, w = sublayer(norm(x))
            return x + self.dropout(h), w
        h, w = sublayer(x)
        return norm(x + self.dropout(h)), w

    def forward(self, x: torch.Tensor, mask: AttentionMask | None = None, *, rope=None, bias=None,
                memory: torch.Tensor | None = None, memory_mask: AttentionMask | None = None,
                cross_bias: torch.Tensor | None = None, cache=None, cross_cache=None, layer_idx: int = 0,
                need_weights: bool = False, varlen=None, positions=None) -> tuple[torch.Tensor, tuple]:
        if self.parallel:  # GPT-J / GPT-NeoX: both sublayers read the same input, x + attn(LN1 x) + ffn(LN2 x)
            h, w_self = self.attn(self.attn_norm(x), mask, rope=rope, bias=bias, cache=cache, layer_idx=layer_idx,
                                  need_weights=need_weights, varlen=varlen, positions=positions)
            return x + self.dropout(h) + self.dropout(self.ffn(self.ffn_norm(x))), (w_self, None)
        x, w_self = self._residual(x, self.attn_norm, lambda h: self.attn(
            h, mask, rope=rope, bias=bias, cache=cache, layer_idx=layer_idx, need_weights=need_weights,
            varlen=varlen, positions=positions))
        w_cross = None
        if self.cross_attn is not None:
            x, w_cross = self._residual(x, self.cross_norm, lambda h: self.cross_attn(
                h, memory_mask, bias=cross_bias, memory=memory, cache=cross_cache, layer_idx=layer_idx,
                need_weights=need_weights))
        x, _ = self._residual(x, self.ffn_norm, lambda h: (self.ffn(h), None))
        return x, (w_self, w_cross)

    def stream(self, x: torch.Tensor, context: torch.Tensor, positions, target_mapping: torch.Tensor | None = None,
               need_weights: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One of XLNet's two streams through this block (Yang et al. 2019, §2.3): queries from `x`, keys and
        values from `context` (mems + the content stream). The query stream's M rows (target_mapping
        (B, M, T)) attend from the positions they predict and come back before the residual. Same
        parameters as the content stream; nn/relative_xl.py has the rest."""
        def attend(h):
            out, w = self.attn(to_positions(h, target_mapping), None, memory=context, positions=positions,
                               need_weights=need_weights)
            return from_positions(out, target_mapping), w
        x, w = self._residual(x, self.attn_norm, attend)
        x, _ = self._residual(x, self.ffn_norm, lambda h: (self.ffn(h), None))
        return x, w
