"""Batch-1 decoding of a GGUF model kept quantized, one C call per token for the whole layer stack.

`generate` at batch 1 on a model whose matrices are all `BlockLinear` (attnlab.load(..., quantized=True))
runs the prompt through the modules as usual (a prefill is a few large products), then each new token
through `llama_decode_step` in nn/csrc/ggml_blocks.c: RMSNorm, Q/K/V, RoPE, attention over the KV cache,
output projection, SwiGLU, residuals, all 30 layers of SmolLM2 in one call. A decoding step is ~300 small
operations; from Python each costs a few microseconds of dispatch, more than its arithmetic, which is
what keeps an eager PyTorch decoder far from llama.cpp on a CPU without a compiler. The C step computes
the same fp32 math as the modules (the KV cache is shared with them), so the two agree to rounding.

`PagedBlockSteps` is the serving engine's counterpart: B decode rows over the paged KV pool, every layer in
one call to `paged_decode_layers` (nn/csrc/paged_step.c).
"""
from __future__ import annotations

import ctypes
import math

import torch

from ..nn.cpu_linear import unhooked
from ..nn.kernel_build import step_scratch_floats
from ..nn.kernels import call_bound
from ..nn.precision import cpu_flags
from ..nn.quantized import BlockEmbedding, BlockLinear, kernels
from ..nn.norms import RMSNorm
from .kv_cache import KVCache
from .paged import slot_rows

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
    return not hooked(model)


def hooked(model) -> bool:
    """Whether a forward hook (on one of the model's modules, or a global one) must see the modules run: the C
    steps would run past it. Asked again at every step of a long-lived engine, since a hook can come at any time
    (~450 modules for SmolLM2: tens of microseconds against a step's milliseconds)."""
    return not all(unhooked(m) for m in model.modules())


def _layer_table(model, keys: list[torch.Tensor], values: list[torch.Tensor]):
    """(tensors to keep alive, 11 pointers a layer, 7 block kinds a layer) in the order the C steps read them:
    attn_norm, ffn_norm, the blocks of q, k, v, o, gate, up, down, then the layer's keys and values."""
    keep, ptrs, kinds = [], [], []
    for i, layer in enumerate(model.backbone.layers):
        ptrs += [layer.attn_norm.weight.data_ptr(), layer.ffn_norm.weight.data_ptr()]
        for n in _PROJ:
            mod = layer.get_submodule(n)
            ptrs.append(mod.blocks.data_ptr())
            kinds.append(mod.kind)
        ptrs += [keys[i].data_ptr(), values[i].data_ptr()]
        keep += [keys[i], values[i], layer.attn_norm.weight, layer.ffn_norm.weight]
    return keep, (ctypes.c_void_p * len(ptrs))(*ptrs), (ctypes.c_int * len(kinds))(*kinds)


def _packed_table(model):
    """(tensors to keep alive, 7 pointers a layer in _PROJ's order): each matrix's 16-row repacked copy for the
    step's integer products (csrc/ggml_x16.c), or NULL where it has none (the GGUF blocks serve)."""
    keep, ptrs = [], []
    for layer in model.backbone.layers:
        for n in _PROJ:
            packed = layer.get_submodule(n).packed_x16()
            ptrs.append(None if packed is None else packed.data_ptr())
            keep.append(packed)
    return keep, (ctypes.c_void_p * len(ptrs))(*ptrs)


def _rope_tables(model, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (capacity, head_dim) of every position, as RotaryEmbedding computes them."""
    angles = torch.arange(capacity, dtype=torch.float32)[:, None] * model.backbone.rope.inv_freq
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos().contiguous(), emb.sin().contiguous()


class BlockSteps:
    """The `_EagerSteps` protocol (next-token logits (1, V) per call) for a `supported` model at batch 1."""

    def __init__(self, model, max_length: int) -> None:
        self.model, self.cfg, self.max_length = model, model.config, max_length
        self.cache = KVCache(self.cfg.num_layers, max_length=max_length)
        self.ptrs = None

    def _bind(self) -> bool:
        """Pointers to every layer's weights and cache buffers, once the prefill has allocated the cache."""
        for i, layer in enumerate(self.model.backbone.layers):
            kc = self.cache.keys[i]
            if kc is None or not kc.is_contiguous() or kc.dtype != torch.float32 or kc.size(2) < self.max_length:
                return False
            if kc.device.type != "cpu" or any(layer.get_submodule(n).blocks.device.type != "cpu" for n in _PROJ):
                return False  # C reads host memory only: any other device takes the model's own step
        cfg = self.cfg
        self.keep, self.ptrs, self.kinds = _layer_table(self.model, self.cache.keys, self.cache.values)
        self.keep_packed, self.packed = _packed_table(self.model)
        self.capacity = self.cache.keys[0].size(2)
        self.x = torch.empty(cfg.hidden_size)
        self.scratch = torch.empty(step_scratch_floats(cfg, scores=self.capacity))
        self.scale = cfg.attention_scale if cfg.attention_scale is not None else 1.0 / math.sqrt(cfg.dim_head)
        self.cos, self.sin = _rope_tables(self.model, self.capacity)
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
                   self.capacity, pos, self.cos[pos].data_ptr(), self.sin[pos].data_ptr(), self.scratch.data_ptr(),
                   torch.get_num_threads(), self.packed)
        self.cache.lengths = [pos + 1] * cfg.num_layers
        return self.model.lm_head(self.model.backbone.final_norm(x))[None]


class PagedBlockSteps:
    """The serving engine's decoding step (one new token for each of B rows) as one C call for the whole layer
    stack (`paged_decode_layers` in nn/csrc/paged_step.c), for a `supported` model whose paged KV pool is on
    the CPU, fp32 or fp16 (where the CPU converts with F16C), with no sliding window. Returns logits (B, V);
    the caller commits the new tokens."""

    def __init__(self, model, pool) -> None:
        cfg = model.config
        self.model, self.cfg, self.pool = model, cfg, pool
        self.keep, self.ptrs, self.kinds = _layer_table(model, pool.keys, pool.values)
        self.slots = pool.keys[0].size(0)
        self.f16 = int(pool.keys[0].dtype == torch.float16)
        self.capacity = cfg.max_position_embeddings
        self.scale = cfg.attention_scale if cfg.attention_scale is not None else 1.0 / math.sqrt(cfg.dim_head)
        self.cos, self.sin = _rope_tables(model, self.capacity)
        self.per_row = step_scratch_floats(cfg)

    def runs_now(self) -> bool:
        """False while a forward hook is on the model (added after the engine was built): the modules run then."""
        return not hooked(self.model)

    @staticmethod
    def usable(model, pool, window) -> bool:
        """The model and pool this step can take: else the engine runs the modules."""
        if window is not None or not supported(model) or not pool.keys:
            return False
        dtype = pool.keys[0].dtype
        if dtype not in (torch.float32, torch.float16) or (dtype == torch.float16 and "f16c" not in cpu_flags()):
            return False  # (C converts to fp16 with F16C only)
        if any(t.dtype != dtype or t.device.type != "cpu" or not t.is_contiguous() for t in (*pool.keys, *pool.values)):
            return False
        layers = model.backbone.layers
        return all(layer.get_submodule(n).blocks.device.type == "cpu" for layer in layers for n in _PROJ)

    def __call__(self, tables, tokens: list[int]) -> torch.Tensor:
        """Rows whose last token (`tokens`) is their only uncached one; `tables` their block tables."""
        cfg, bs = self.cfg, self.pool.block_size
        b = len(tables)
        positions = [t.length for t in tables]
        if max(positions) >= self.capacity:
            raise ValueError(f"decode step: position {max(positions)} is past the model's {self.capacity}")
        held = [t.slots(t.first_held(bs), p + 1, bs) for t, p in zip(tables, positions)]
        slots, offs = slot_rows(held)
        pos = torch.tensor(positions, dtype=torch.int64)
        write = torch.tensor([h[-1] for h in held], dtype=torch.int64)
        x = self.model.backbone.embeddings.tok(torch.tensor(tokens)).float().contiguous()
        scratch = torch.empty(b * self.per_row)
        call_bound("paged_decode_layers", cfg.num_layers, b, x.data_ptr(), self.ptrs, self.kinds, cfg.hidden_size,
                   cfg.num_heads, cfg.kv_heads, cfg.dim_head, cfg.intermediate_size, cfg.norm_eps, self.scale,
                   self.slots, self.capacity, pos.data_ptr(), self.cos.data_ptr(), self.sin.data_ptr(),
                   write.data_ptr(), slots.data_ptr(), offs.data_ptr(), slots.numel(), self.f16, scratch.data_ptr(),
                   torch.get_num_threads())
        return self.model.lm_head(self.model.backbone.final_norm(x)).float()
