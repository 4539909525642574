"""Scaled dot-product attention, multi-head, with padding / causal / sliding-window masks and
grouped-query attention (Vaswani et al. 2017, §3.2; Ainslie et al. 2023 for GQA).

    Attention(Q, K, V) = softmax(Q Kᵀ / sqrt(d_k) + bias) V

Two paths with one meaning: the fused kernel `F.scaled_dot_product_attention` (fast, no weights) and an
explicit path that materialises the softmax so that the weights can be returned (for `viz`). Tests hold
them equal for every mask kind.
"""
from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from .block_sparse import block_sparse_attention, dense_attention, draw_random_blocks, token_counts, uses_blocks
from .disentangled import DisentangledBias
from . import dropout as _dropout
from .cpu_attention import causal_attention, rows_see_a_key, short_attention
from .cpu_linear import forget_packed, module_linear, packed_linear, plain_module, unhooked
from .flash import tiled_attention
from .int8 import Int8Linear
from .linear_attention import LinearAttentionCache, linear_attention, linear_attention_weights
from .positions import apply_rotary
from .relative_xl import RelativeXLBias, XLPositions
from .varlen import Varlen

# F.scaled_dot_product_attention(enable_gqa=) exists from torch 2.5 on
_HAS_GQA = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)


class AttentionMask:
    """Which keys each query may see. `allowed` is bool, broadcastable to (B, heads, Tq, Tk), True = may
    attend; None with `is_causal` means a plain causal mask the fused kernel builds itself (faster).

    A mask from `build` also keeps its recipe (causal, window, offset, padding, documents) and makes the
    dense (B, 1, Tq, Tk) tensor only when `allowed` is first read: the tiled path asks for one
    (query block, key block) tile at a time with `block()` and never holds the T x T matrix."""

    def __init__(self, allowed: torch.Tensor | None = None, is_causal: bool = False) -> None:
        self._allowed, self.is_causal, self._recipe = allowed, is_causal, None

    @property
    def allowed(self) -> torch.Tensor | None:
        if self._allowed is None and self._recipe is not None:
            tq, tk = self._recipe["shape"]
            self._allowed = rows_see_a_key(self._from_recipe(0, tq, 0, tk))
        return self._allowed

    def __repr__(self) -> str:
        return f"AttentionMask(is_causal={self.is_causal}, recipe={self._recipe is not None}, " \
               f"materialized={self._allowed is not None})"

    @classmethod
    def build(cls, padding: torch.Tensor | None, query_len: int, key_len: int, *, causal: bool = False,
              window: int | None = None, query_offset: int = 0, device=None,
              documents: torch.Tensor | None = None, global_tokens: torch.Tensor | None = None) -> "AttentionMask":
        """padding: (B, Tk) with 1 for real tokens, 0 for padding (the HF `attention_mask`).
        query_offset: absolute position of the first query (> 0 when decoding with a KV cache).
        documents: (B, T) document ids of a packed batch (several examples in one row, nothing cached):
        a token sees only tokens of its own document (a block-diagonal mask: no cross-contamination).
        global_tokens: (B, T) Longformer's global attention (Beltagy et al. 2020, §3.1): a global token
        sees every token and every token sees it, whatever the window."""
        if global_tokens is not None and not bool(global_tokens.any()):
            global_tokens = None
        if global_tokens is not None and (global_tokens.shape[-1] != key_len or query_len != key_len):
            raise ValueError(f"global_attention_mask has shape {tuple(global_tokens.shape)}; expected (batch, "
                             f"{key_len}) and no KV cache")
        has_padding = padding is not None and not bool(padding.all())
        if documents is not None and (documents.shape[-1] != key_len or query_len != key_len):
            raise ValueError(f"document_ids has shape {tuple(documents.shape)}; expected (batch, {key_len}) "
                             "and no KV cache (packing is for training)")
        if not has_padding and window is None and documents is None and global_tokens is None:
            if not causal:
                return cls(None, False)
            if query_offset == 0 and query_len == key_len:
                return cls(None, True)
            if query_len == 1 and query_offset + 1 == key_len:
                return cls(None, False)  # a decoding step: the newest token sees every key
        device = padding.device if padding is not None else documents.device if documents is not None else device
        mask = cls(None, False)
        mask._recipe = dict(shape=(query_len, key_len), causal=causal, window=window, offset=query_offset,
                            padding=padding.bool() if has_padding else None, documents=documents, device=device,
                            global_tokens=global_tokens.bool() if global_tokens is not None else None)
        return mask

    @property
    def global_tokens(self) -> torch.Tensor | None:
        return self._recipe["global_tokens"] if self._recipe is not None else None

    def _from_recipe(self, qs: int, qe: int, ks: int, ke: int) -> torch.Tensor:
        """The allowed tile of queries qs:qe and keys ks:ke, (B or 1, 1, qe - qs, ke - ks), before the
        empty-row rule."""
        r = self._recipe
        q = torch.arange(r["offset"] + qs, r["offset"] + qe, device=r["device"])[:, None]
        k = torch.arange(ks, ke, device=r["device"])[None, :]
        allowed = torch.ones(qe - qs, ke - ks, dtype=torch.bool, device=r["device"])
        if r["causal"]:
            allowed &= k <= q
        if r["window"] is not None:
            # a local layer sees keys at distance < window on each side it is allowed to look at
            allowed &= (q - k).abs() < r["window"]
        allowed = allowed[None, None]
        if r["global_tokens"] is not None:
            g = r["global_tokens"]
            allowed = allowed | g[:, None, None, ks:ke] | g[:, None, qs:qe, None]
        if r["documents"] is not None:
            docs = r["documents"]
            allowed = allowed & (docs[:, None, qs:qe, None] == docs[:, None, None, ks:ke])
        if r["padding"] is not None:
            allowed = allowed & r["padding"][:, None, None, ks:ke]
        return allowed

    def key_padding(self, kind: str = "linear attention") -> torch.Tensor | None:
        """(B, Tk) bool, True = real key, or None: all a kind without a general mask (linear attention,
        BigBird's block-sparse attention) can honour; a window, packed documents or a bare mask tensor are
        an error that says so."""
        r = self._recipe
        if r is None:
            if self._allowed is not None:
                raise ValueError(f"{kind} takes padding and causal masks only, not a dense mask tensor")
            return None
        if r["window"] is not None or r["documents"] is not None or r["global_tokens"] is not None:
            raise ValueError(f"{kind} takes padding and causal masks only, not a sliding window, "
                             "packed documents (document_ids) or global tokens")
        return r["padding"]

    def only_padding(self, decoding: bool = False) -> tuple[bool, torch.Tensor | None]:
        """(True, (B, Tk) bool or None) when this mask is at most key padding (no causal, window, documents,
        global tokens or dense tensor), else (False, None). decoding: a causal mask that hides nothing (one
        query after every key: a decoding step's) counts as no mask."""
        r = self._recipe
        if r is None:
            return self._allowed is None and not self.is_causal, None
        causal = r["causal"] and not (decoding and r["shape"][0] == 1 and r["offset"] + 1 == r["shape"][1])
        if (causal or r["window"] is not None or r["documents"] is not None or r["global_tokens"] is not None
                or r["shape"][1] != (r["padding"].size(-1) if r["padding"] is not None else r["shape"][1])):
            return False, None
        return True, r["padding"]

    def block(self, qs: int, qe: int, ks: int, ke: int, query_len: int, key_len: int, device=None):
        """The tile of queries qs:qe x keys ks:ke for the tiled path: None = every key allowed, False =
        none (a tile under the causal diagonal or outside the window: skipped, which is what makes
        sliding-window attention linear), else a bool tensor broadcastable to (B, H, qe - qs, ke - ks).
        Rows that see nothing at all are the caller's to handle (see nn/flash.py)."""
        r = self._recipe
        if r is None:
            if self._allowed is not None:
                a = self._allowed
                return a[..., qs:qe, :][..., ks:ke] if a.size(-2) > 1 else a[..., ks:ke]
            if not self.is_causal:
                return None
            r = dict(causal=True, window=None, offset=key_len - query_len, padding=None, documents=None,
                     device=None, global_tokens=None)
        g = r["global_tokens"]
        if g is not None and bool(g[:, ks:ke].any() | g[:, qs:qe].any()):
            return self._from_recipe(qs, qe, ks, ke)  # a global row or column: never skipped
        first_q, last_q = r["offset"] + qs, r["offset"] + qe - 1
        if r["causal"] and ks > last_q:
            return False
        if r["window"] is not None and (first_q - (ke - 1) >= r["window"]
                                        or (not r["causal"] and ks - last_q >= r["window"])):
            return False
        full = (not r["causal"] or ke - 1 <= first_q) and (
            r["window"] is None or max(last_q - ks, ke - 1 - first_q) < r["window"])
        if full and r["padding"] is None and r["documents"] is None:
            return None
        if self._recipe is None:  # plain causal tile on the diagonal
            q = torch.arange(first_q, last_q + 1, device=device)[:, None]
            return (torch.arange(ks, ke, device=device)[None, :] <= q)[None, None]
        return self._from_recipe(qs, qe, ks, ke)


# Query rows per call when a long causal self-attention is split (`_causal_blocks`): at T = 512, SmolLM2's
# heads, bf16, one thread, quiet: 32 rows 22.4 ms, 64 23.4, 128 25.0 per layer of 4 windows (64: fewer calls).
_CAUSAL_BLOCK = 64
# Keys up to which bf16 training on a CPU computes attention in fp32: forward + backward of torch's flash kernel,
# one thread, d = 32: T = 64 2.6 ms fp32 vs 7.5 ms bf16 (causal, 12 x 4 heads), 28 vs 59 ms (32 x 12 heads);
# T = 256 105 vs 122 ms; at T = 512 (d = 64) bf16 is 6% faster.
_FP32_TRAINING_KEYS = 256


def _causal_blocks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, gqa: bool) -> torch.Tensor:
    """Plain causal self-attention as blocks of query rows, each given only the keys up to its own end.
    torch's CPU flash kernel splits the keys into blocks of 512, so at T <= 512 its causal flag skips no
    work; here the masked upper triangle is skipped block by block: 26-31% less time at T = 512 (SmolLM2's
    9 query / 3 key heads, fp32 and bf16, one thread). Same values: the skipped keys have weight 0."""
    t, out = q.size(2), []
    for s in range(0, t, _CAUSAL_BLOCK):
        e = min(s + _CAUSAL_BLOCK, t)
        allowed = torch.ones(e - s, e, dtype=torch.bool, device=q.device).tril(s)
        out.append(F.scaled_dot_product_attention(q[:, :, s:e], k[:, :, :e], v[:, :, :e], attn_mask=allowed,
                                                  scale=scale, **({"enable_gqa": True} if gqa else {})))
    return torch.cat(out, dim=2)


def _attention_dropout(q, k, v, mask: AttentionMask, bias, scale: float, dropout_p: float) -> torch.Tensor | None:
    """Attention with dropout on its probabilities, on a CPU, for key-padding masks (an encoder in training):
    torch's SDPA takes its math path there and draws the mask with bernoulli_; the same products with the
    one-pass dropout (nn/dropout.py) take ~0.6x its time forward and backward (MiniLM, 16 x 64 tokens).
    None when this case is not covered (then SDPA runs)."""
    padding_only, keep = mask.only_padding()
    if not padding_only or not _dropout.applies(q) or q.shape[:2] != k.shape[:2]:
        return None
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if bias is not None:
        scores = scores + bias
    if keep is not None:
        keep = rows_see_a_key(keep.to(torch.bool))
        hidden = torch.zeros(keep.shape, dtype=scores.dtype, device=q.device).masked_fill_(~keep, float("-inf"))
        scores = scores + hidden[:, None, None, :]
    probs = scores.float().softmax(-1).to(q.dtype)
    return torch.matmul(_dropout.dropout(probs, dropout_p), v)


def scaled_dot_product_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                 mask: AttentionMask | None = None, bias: torch.Tensor | None = None,
                                 scale: float | None = None, dropout_p: float = 0.0,
                                 explicit: bool = False, tiled: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q (B, H, Tq, d), k/v (B, Hkv, Tk, d) with H a multiple of Hkv. Returns (out (B, H, Tq, d), weights or None).
    explicit: materialise the weights (and return them); tiled: FlashAttention's algorithm (nn/flash.py)."""
    if (q.dtype == torch.bfloat16 and q.device.type == "cpu" and not explicit and not tiled
            and k.size(-2) <= _FP32_TRAINING_KEYS and torch.is_grad_enabled()
            and (q.requires_grad or k.requires_grad or v.requires_grad)):
        # bf16 training on a CPU: torch's flash kernel is slow backwards in bf16 on short sequences, so attention
        # runs in fp32 there (more exact too); the output goes back to bf16 for the next product.
        with torch.autocast("cpu", enabled=False):
            out, _ = scaled_dot_product_attention(q.float(), k.float(), v.float(), mask,
                                                  None if bias is None else bias.float(), scale, dropout_p)
        return out.to(q.dtype), None
    groups = q.size(1) // k.size(1)  # GQA/MQA: each key/value head serves a group of query heads
    scale = q.size(-1) ** -0.5 if scale is None else scale
    mask = mask or AttentionMask()
    if (mask.is_causal and mask.allowed is None and bias is None and not explicit and not tiled and dropout_p == 0
            and q.device.type == "cpu" and not torch.is_grad_enabled() and q.size(2) == k.size(2) >= 2 * _CAUSAL_BLOCK
            and (groups == 1 or _HAS_GQA)):  # inference on long prompts/windows (training keeps one fused call)
        out = causal_attention(q, k, v, scale)  # bf16 with AVX512-BF16: one C kernel (nn/cpu_attention.py)
        return (_causal_blocks(q, k, v, scale, groups > 1) if out is None else out), None
    if groups > 1 and not explicit and not tiled and bias is None:
        if q.size(2) == 1 and not mask.is_causal:
            # One query per head (a decoding step): the group's query heads become the kv head's queries,
            # (B, Hkv, groups, d), so that no key/value is ever copied.
            b, h, _, d = q.shape
            out = F.scaled_dot_product_attention(q.view(b, k.size(1), groups, d), k, v, attn_mask=mask.allowed,
                                                 dropout_p=dropout_p, scale=scale)
            return out.view(b, h, 1, d), None
        if _HAS_GQA:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.allowed, dropout_p=dropout_p,
                                                 is_causal=mask.is_causal, scale=scale, enable_gqa=True)
            return out, None
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    if tiled and not explicit:
        return tiled_attention(q, k, v, mask, bias, scale, dropout_p), None
    if explicit:
        scores = torch.matmul(q, k.transpose(-2, -1)) * scale
        if bias is not None:
            scores = scores + bias
        if mask.is_causal:
            tq, tk = scores.shape[-2:]
            mask = AttentionMask(torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril(tk - tq))
        if mask.allowed is not None:
            scores = scores.masked_fill(~mask.allowed, float("-inf"))
        weights = scores.float().softmax(-1).to(q.dtype)
        probs = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
        return torch.matmul(probs, v), weights
    if dropout_p > 0 and q.device.type == "cpu":
        out = _attention_dropout(q, k, v, mask, bias, scale, dropout_p)
        if out is not None:
            return out, None
    if bias is None and dropout_p == 0 and q.device.type == "cpu" and q.dtype == torch.float32:
        padding_only, keep = mask.only_padding()
        # short sequences (an encoder over sentences): our kernel, 2-3x torch's at T <= 48 (nn/cpu_attention.py)
        out = short_attention(q, k, v, keep, scale) if padding_only else None
        if out is not None:
            return out, None
    attn_mask = mask.allowed
    if bias is not None:
        attn_mask = bias if attn_mask is None else bias.masked_fill(~attn_mask, float("-inf"))
        is_causal = False
        if mask.is_causal:
            tq, tk = q.size(-2), k.size(-2)
            causal = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril(tk - tq)
            attn_mask = attn_mask.masked_fill(~causal, float("-inf"))
    else:
        is_causal = mask.is_causal
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        attn_mask = attn_mask.to(q.dtype)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                         is_causal=is_causal, scale=scale)
    return out, None


class KVCacheLike(Protocol):
    """What attention needs from a KV cache: append this step's keys/values, get the whole history."""

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


class Attention(nn.Module):
    """Multi-head attention: project to Q, K, V, split into heads, attend, merge heads, project out.
    With `cross=True` the keys and values come from another sequence (the encoder's output)."""

    def __init__(self, config: ModelConfig, cross: bool = False) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.kv_heads, config.dim_head
        d, bias = config.hidden_size, config.bias
        qkv_bias = bias if config.qkv_bias is None else config.qkv_bias
        self.q = nn.Linear(d, self.num_heads * self.head_dim, bias=qkv_bias)
        self.k = nn.Linear(d, self.num_kv_heads * self.head_dim, bias=qkv_bias)
        self.v = nn.Linear(d, self.num_kv_heads * self.head_dim, bias=qkv_bias)
        # Transformer-XL / XLNet: relative position (and segment) terms added to Q Kᵀ (nn/relative_xl.py); its
        # attention projections, the output one included, carry no bias (Dai et al. 2019, §3.3)
        self.xl = RelativeXLBias(config) if config.position == "relative_xl" and not cross else None
        self.o = nn.Linear(self.num_heads * self.head_dim, d, bias=bias and self.xl is None)
        if config.global_attention and not cross:  # Longformer's own Q/K/V for global tokens (§3.1)
            self.q_global, self.k_global, self.v_global = (
                nn.Linear(d, self.num_heads * self.head_dim, bias=qkv_bias) for _ in range(3))
        self.global_attention = config.global_attention and not cross
        # DeBERTa: c2p / p2c scores from relative positions, added to Q Kᵀ (nn/disentangled.py)
        self.rel = DisentangledBias(config) if config.disentangled_attention and not cross else None
        self.scale = config.attention_scale if config.attention_scale is not None or self.rel is None else self.rel.scale
        self.dropout = config.attention_dropout
        self.explicit = config.attn_implementation == "eager"
        self.tiled = config.attn_implementation == "tiled"
        self.linear = config.attention_kind == "linear"
        # BigBird (nn/block_sparse.py): blocks of sparse_block_size, r random blocks per query block
        self.block_sparse = config.attention_kind == "block_sparse" and not cross
        self.sparse_block, self.num_random = config.sparse_block_size, config.num_random_blocks
        self.causal = config.causal and not cross
        self.cross = cross

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Q, K, V of one input. Without autograd they come from one GEMM against the three weights
        stacked: x is read once and the wider product runs nearer the matmul peak (+12-15% on these
        GEMMs on CPU). Training keeps three products so that gradients reach the plain modules; a
        quantized or compiled model keeps them too, and so does a projection with a forward hook (the
        attention views catch Q and K that way): a hook must see its module called."""
        mods = (self.q, self.k, self.v)
        if all(type(m) is Int8Linear and unhooked(m) for m in mods):
            # int8 (nn/int8.py): the activations are quantized once and Q, K, V come from one product
            key = tuple(m.weight_q.data_ptr() for m in mods)  # new storage (`.to()`) rebuilds it
            fused = self.__dict__.get("_int8_qkv")
            if fused is None or fused[0] != key:
                fused = self.__dict__["_int8_qkv"] = (key, Int8Linear.stacked(list(mods)))
            if fused[1] is not None:
                return fused[1](x).split([m.out_features for m in mods], dim=-1)
            return self.q(x), self.k(x), self.v(x)
        if torch.is_grad_enabled() or torch.compiler.is_compiling() or not all(plain_module(m) for m in mods):
            return self.q(x), self.k(x), self.v(x)
        weight, bias = self._stacked_qkv()
        out = packed_linear(self, "qkv", x, weight, bias) if not self.causal else None
        return (out if out is not None else F.linear(x, weight, bias)).split([self.q.out_features, self.k.out_features,
                                                self.v.out_features], dim=-1)

    def train(self, mode: bool = True) -> "Attention":
        # AdamW(fused=True) updates the weights in place without bumping their version counter, so the
        # stacked weights could outlive an optimizer step: they are dropped at every mode change too
        # (every evaluation starts with model.eval(), every training stretch with model.train())
        self.__dict__.pop("_qkv_cache", None)
        forget_packed(self, self.o)
        return super().train(mode)

    def _stacked_qkv(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The stacked weights, rebuilt whenever a projection changed: a per-tensor optimizer step or a
        load_state_dict bumps the tensor's version (a fused one does not: see `train`), `.to()` gives it new storage (weights created under
        inference_mode have no version counter: only their storage is compared). Kept out of the state
        dict; costs one extra copy of the Q/K/V weights."""
        mods = (self.q, self.k, self.v)
        params = [p for m in mods for p in (m.weight, m.bias) if p is not None]
        key = tuple((p.data_ptr(), -1 if p.is_inference() else p._version, p.dtype, p.device) for p in params)
        cached = self.__dict__.get("_qkv_cache")
        if cached is None or cached[0] != key:
            weight = torch.cat([m.weight for m in mods])
            bias = None
            if any(m.bias is not None for m in mods):
                bias = torch.cat([m.bias if m.bias is not None else m.weight.new_zeros(m.out_features)
                                  for m in mods])
            cached = self.__dict__["_qkv_cache"] = (key, weight, bias)
        return cached[1], cached[2]

    def forward(self, x: torch.Tensor, mask: AttentionMask | None = None, *,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None, bias: torch.Tensor | None = None,
                memory: torch.Tensor | None = None, cache: KVCacheLike | None = None, layer_idx: int = 0,
                need_weights: bool = False, varlen: Varlen | None = None,
                positions: tuple[torch.Tensor, torch.Tensor] | XLPositions | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """positions: DeBERTa's (relative-position table, index) from the Encoder, for disentangled attention;
        XLNet's `XLPositions` (the table, segments and this stream's mask: pass mask=None then)."""
        if self.xl is not None and (not isinstance(positions, XLPositions) or cache is not None):
            raise ValueError("relative_xl attention needs the encoder's XLPositions (and carries context in "
                             "`mems`, not a KV cache)")
        if self.rel is not None:
            if positions is None or cache is not None:
                raise ValueError("disentangled attention needs the encoder's relative positions and no KV cache")
            projected = self.rel.project(positions, self.q, self.k)
        if varlen is not None:
            # x is (N, d), real tokens only: project them, then attend in the padded (B, T) layout
            b, t = varlen.batch, varlen.seq_len
            q, k, v = (varlen.pad(y).view(b, t, -1, self.head_dim).transpose(1, 2) for y in self._project(x))
        elif memory is None:
            b, t, _ = x.shape
            q, k, v = (y.view(b, t, -1, self.head_dim).transpose(1, 2) for y in self._project(x))
        else:
            b, t, _ = x.shape
            q = self.q(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
            k = self.k(memory).view(b, memory.size(1), self.num_kv_heads, self.head_dim).transpose(1, 2)
            v = self.v(memory).view(b, memory.size(1), self.num_kv_heads, self.head_dim).transpose(1, 2)
        if rope is not None:
            cos, sin = rope
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if self.xl is not None:
            rel = self.xl(q, k, positions, q.size(-1) ** -0.5 if self.scale is None else self.scale)
            bias = rel if bias is None else bias + rel
        if self.rel is not None:
            rel = self.rel(q, k, projected, positions[1])
            bias = rel if bias is None else bias + rel
        if self.linear:
            out, weights = self._linear(q, k, v, mask, cache, layer_idx, need_weights)
        elif self.block_sparse and cache is None and uses_blocks(t, self.sparse_block, self.num_random):
            out, weights = self._block_sparse(q, k, v, mask, need_weights)
        else:
            out = weights = None
            attend = getattr(cache, "decode_attention", None)  # a paged cache reads its blocks in place
            if (attend is not None and bias is None and not (need_weights or self.explicit or self.tiled)
                    and (mask is None or mask.only_padding(decoding=True)[0])
                    and not (self.training and self.dropout)):
                out = attend(layer_idx, q, k, v, q.size(-1) ** -0.5 if self.scale is None else self.scale)
            if out is None:
                if cache is not None:
                    k, v = cache.update(layer_idx, k, v)
                out, weights = scaled_dot_product_attention(
                    q, k, v, mask, bias, self.scale, self.dropout if self.training else 0.0,
                    explicit=need_weights or self.explicit, tiled=self.tiled)
        if self.global_attention and mask is not None and mask.global_tokens is not None:
            if cache is not None:
                raise ValueError("global attention (Longformer) does not decode with a KV cache")
            out = self._global_rows(varlen.pad(x) if varlen is not None else x, out, mask)
        out = out.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim)
        if varlen is not None:
            out = varlen.unpad(out)
        projected = module_linear(self.o, out) if not self.causal else None
        return (projected if projected is not None else self.o(out)), weights

    def _global_rows(self, x: torch.Tensor, out: torch.Tensor, mask: AttentionMask) -> torch.Tensor:
        """Longformer (Beltagy et al. 2020, §3.1): a global token's output is attention over every (real)
        token through the separate q/k/v_global projections. Only the n global rows are computed, so the
        cost is O(n T), not O(T^2). x (B, T, d) padded layout; out (B, H, T, d_h) from the local pass."""
        g = mask.global_tokens
        b, t, _ = x.shape
        n = int(g.sum(1).max())
        idx = torch.argsort((~g).to(torch.int8), dim=1, stable=True)[:, :n]  # each row's global positions first
        valid = torch.gather(g, 1, idx)
        rows = torch.gather(x, 1, idx[..., None].expand(b, n, x.size(-1)))
        q = self.q_global(rows).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        k, v = (p(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2) for p in (self.k_global, self.v_global))
        padding = mask._recipe["padding"]
        glob, _ = scaled_dot_product_attention(q, k, v, AttentionMask.build(padding, n, t, device=x.device), None,
                                               self.scale, self.dropout if self.training else 0.0,
                                               explicit=self.explicit, tiled=self.tiled)
        at = idx[:, None, :, None].expand(b, self.num_heads, n, self.head_dim)
        return out.scatter(2, at, torch.where(valid[:, None, :, None], glob, out.gather(2, at)))

    def _block_sparse(self, q, k, v, mask, need_weights):
        """attention_kind=block_sparse (BigBird): pad to whole blocks (padding keys masked, as transformers
        pads its input), attend blockwise, cut back. Random blocks are drawn afresh in training only (see
        nn/block_sparse.py for eval mode). need_weights: the dense T x T reference, same numbers."""
        b, _, t, _ = q.shape
        padding = mask.key_padding("block-sparse attention") if mask is not None else None
        groups = q.size(1) // k.size(1)
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        extra = -t % self.sparse_block
        if extra:
            q, k, v = (F.pad(x, (0, 0, 0, extra)) for x in (q, k, v))
            real = torch.ones(b, t, dtype=torch.bool, device=q.device) if padding is None else padding
            padding = F.pad(real, (0, extra), value=False)
        n = (t + extra) // self.sparse_block
        random = draw_random_blocks(n, self.num_random, q.size(1), device=q.device) if self.training else None
        scale = q.size(-1) ** -0.5 if self.scale is None else self.scale
        if need_weights:
            counts = token_counts(t + extra, self.sparse_block, self.num_random, random, q.device)
            out, weights = dense_attention(q, k, v, padding, counts, scale)
            return out[:, :, :t], weights[:, :, :t, :t]
        out = block_sparse_attention(q, k, v, padding, self.sparse_block, self.num_random, random, scale,
                                     self.dropout if self.training else 0.0)
        return out[:, :, :t], None

    def _linear(self, q, k, v, mask, cache, layer_idx, need_weights):
        """attention_kind=linear (nn/linear_attention.py): a LinearAttentionCache carries the recurrent
        state; any other cache hands back the whole history, folded into the state again."""
        padding = mask.key_padding() if mask is not None else None
        groups = q.size(1) // k.size(1)
        if cache is not None and not isinstance(cache, LinearAttentionCache):
            k, v = cache.update(layer_idx, k, v)
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        if isinstance(cache, LinearAttentionCache):
            out = cache.attend(layer_idx, q, k, v, padding)
        else:
            out, _ = linear_attention(q, k, v, causal=self.causal, key_padding=padding)
        weights = linear_attention_weights(q, k, causal=self.causal, key_padding=padding) if need_weights else None
        return out, weights
