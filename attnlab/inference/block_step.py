"""Batch-1 decoding of a GGUF model kept quantized, one C call per token for the whole layer stack.

`generate` at batch 1 on a model whose matrices are all `BlockLinear` (attnlab.load(..., quantized=True))
runs the prompt through the modules as usual (a prefill is a few large products), then each new token
through `llama_decode_step` in nn/csrc/ggml_blocks.c: RMSNorm, Q/K/V, RoPE, attention over the KV cache,
output projection, SwiGLU, residuals, all 30 layers of SmolLM2 in one call. A decoding step is ~300 small
operations; from Python each costs a few microseconds of dispatch, more than its arithmetic, which is
what keeps an eager PyTorch decoder far from llama.cpp on a CPU without a compiler. The C step computes
the same fp32 math as the modules (the KV cache is shared with them), so the two agree to rounding.
"""
from __future__ import annotations

import ctypes
import math

import torch

from ..nn.kernels import call_bound
from ..nn.quantized import BlockEmbedding, BlockLinear, kernels
from ..nn.norms import RMSNorm
from .kv_cache import KVCache

_PROJ = ("attn.q", "attn.k", "attn.v", "attn.o", "ffn.gate", "ffn.up", "ffn.down")


def supported(model) -> bool:
    """True for a pre-RMSNorm, rotary, SwiGLU, bias-free causal LM whose every matrix is in blocks."""
    cfg = getattr(model, "config", None)
    backbone = getattr(model, "backbone", None)
    if cfg is None or backbone is None or kernels() is None or not hasattr(model, "lm_head"):
        return False
    if (cfg.position != "rope" or cfg.norm != "rmsnorm" or cfg.norm_placement != "pre" or cfg.activation != "swiglu"
            or cfg.bias or cfg.sliding_window or cfg.num_experts or backbone.local_rope is not None
            or backbone.relative_bias is not None or cfg.scale_embeddings or cfg.dim_head % 2):
        return False
    emb = backbone.embeddings
    if (not isinstance(emb.tok, BlockEmbedding) or emb.seg is not None or emb.norm is not None
            or emb.project is not None or emb.pos is not None or emb.sinusoid is not None):
        return False
    if not isinstance(model.lm_head, BlockLinear) or not isinstance(backbone.final_norm, RMSNorm):
        return False
    for layer in backbone.layers:
        if getattr(layer, "cross_attn", None) is not None or not isinstance(layer.attn_norm, RMSNorm):
            return False
        if not all(isinstance(layer.get_submodule(n), BlockLinear) for n in _PROJ):
            return False
    return not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


class BlockSteps:
    """The `_EagerSteps` protocol (next-token logits (1, V) per call) for a `supported` model at batch 1."""

    def __init__(self, model, max_length: int) -> None:
        self.model, self.cfg, self.max_length = model, model.config, max_length
        self.cache = KVCache(self.cfg.num_layers, max_length=max_length)
        self.ptrs = None

    def _bind(self) -> bool:
        """Pointers to every layer's weights and cache buffers, once the prefill has allocated the cache."""
        keep, ptrs, kinds = [], [], []
        for i, layer in enumerate(self.model.backbone.layers):
            kc, vc = self.cache.keys[i], self.cache.values[i]
            if kc is None or not kc.is_contiguous() or kc.dtype != torch.float32 or kc.size(2) < self.max_length:
                return False
            if kc.device.type != "cpu" or any(layer.get_submodule(n).blocks.device.type != "cpu" for n in _PROJ):
                return False  # C reads host memory only: any other device takes the model's own step
            ptrs += [layer.attn_norm.weight.data_ptr(), layer.ffn_norm.weight.data_ptr()]
            for n in _PROJ:
                mod = layer.get_submodule(n)
                ptrs.append(mod.blocks.data_ptr())
                kinds.append(mod.kind)
            ptrs += [kc.data_ptr(), vc.data_ptr()]
            keep += [kc, vc, layer.attn_norm.weight, layer.ffn_norm.weight]
        cfg = self.cfg
        self.keep = keep
        self.ptrs = (ctypes.c_void_p * len(ptrs))(*ptrs)
        self.kinds = (ctypes.c_int * len(kinds))(*kinds)
        self.capacity = self.cache.keys[0].size(2)
        self.x = torch.empty(cfg.hidden_size)
        self.scratch = torch.empty(2 * cfg.hidden_size + 2 * (cfg.num_heads + cfg.kv_heads) * cfg.dim_head
                                   + self.capacity + 2 * cfg.intermediate_size)
        self.scale = cfg.attention_scale if cfg.attention_scale is not None else 1.0 / math.sqrt(cfg.dim_head)
        inv = self.model.backbone.rope.inv_freq
        angles = torch.arange(self.capacity, dtype=torch.float32)[:, None] * inv  # as RotaryEmbedding does
        emb = torch.cat((angles, angles), dim=-1)
        self.cos, self.sin = emb.cos().contiguous(), emb.sin().contiguous()
        return True

    def __call__(self, step_input: torch.Tensor) -> torch.Tensor:
        pos = self.cache.get_seq_length()
        if pos == 0 or step_input.size(1) != 1 or (self.ptrs is None and not self._bind()) or pos >= self.capacity:
            out = self.model(step_input, past_key_values=self.cache, use_cache=True, logits_to_keep=1)
            return out.logits[:, -1].float()
        cfg, x = self.cfg, self.x
        x.copy_(self.model.backbone.embeddings.tok(step_input.reshape(1))[0])
        # Status != 0: an unsupported block type or a cache overflow (raised by the door as RuntimeError).
        call_bound("llama_decode_step", cfg.num_layers, x.data_ptr(), self.ptrs, self.kinds, cfg.hidden_size,
                   cfg.num_heads, cfg.kv_heads, cfg.dim_head, cfg.intermediate_size, cfg.norm_eps, self.scale,
                   self.capacity, pos, self.cos[pos].data_ptr(), self.sin[pos].data_ptr(), self.scratch.data_ptr())
        self.cache.lengths = [pos + 1] * cfg.num_layers
        return self.model.lm_head(self.model.backbone.final_norm(x))[None]
