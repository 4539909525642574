"""GGUF (llama.cpp's single-file format) in: config, weights and tokenizer from one `.gguf` file.

A GGUF file holds key/value metadata (architecture sizes, the tokenizer's tokens and merges, the chat
template) and tensors, often block-quantized (Q4_1: 32 weights share a scale and a minimum). We parse
the header ourselves, dequantize every tensor to fp32 with the `gguf` package, and build the same
`CausalLM` a Hugging Face LLaMA checkpoint gives. Two layout differences from Hugging Face are undone:
  - tensor names (`blk.{i}.attn_q` ...) map through `NAMES` below;
  - llama.cpp's converter permutes the rows of Q and K so that RoPE rotates adjacent pairs (2i, 2i+1);
    our RoPE rotates (i, i + d/2) ("rotate half"), so the permutation is inverted per head.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..config import CheckpointError
from ..gguf_file import GGUFFile, StringArray, _reader  # noqa: F401  (the header reader; re-exported)
from ..gguf_meta import (SUPPORTED_ARCHITECTURES, check_shapes_before_allocating, config_from_gguf,  # noqa: F401
                         gguf_config, gguf_shapes, metadata, tokenizer_from_gguf, unpermute_rope)

# GGUF tensor name -> our CausalLM parameter name
NAMES = [
    ("token_embd.weight", "backbone.embeddings.tok.weight"),
    ("output_norm.weight", "backbone.final_norm.weight"),
    ("output.weight", "lm_head.weight"),
    ("blk.{i}.attn_norm.weight", "backbone.layers.{i}.attn_norm.weight"),
    ("blk.{i}.attn_q.weight", "backbone.layers.{i}.attn.q.weight"),
    ("blk.{i}.attn_k.weight", "backbone.layers.{i}.attn.k.weight"),
    ("blk.{i}.attn_v.weight", "backbone.layers.{i}.attn.v.weight"),
    ("blk.{i}.attn_output.weight", "backbone.layers.{i}.attn.o.weight"),
    ("blk.{i}.ffn_norm.weight", "backbone.layers.{i}.ffn_norm.weight"),
    ("blk.{i}.ffn_gate.weight", "backbone.layers.{i}.ffn.gate.weight"),
    ("blk.{i}.ffn_up.weight", "backbone.layers.{i}.ffn.up.weight"),
    ("blk.{i}.ffn_down.weight", "backbone.layers.{i}.ffn.down.weight"),
]
_PATTERNS = [(re.compile("^" + re.escape(g).replace(r"\{i\}", r"(\d+)") + "$"), ours) for g, ours in NAMES]
IGNORED = ("rope_freqs.weight",)


def is_gguf(path: str | Path) -> bool:
    return Path(path).suffix.lower() == ".gguf" and Path(path).is_file()


def _dequantize(reader: GGUFFile, name: str, dims: list[int], kind_id: int, offset: int) -> np.ndarray:
    raw = reader.tensor_bytes(name, dims, kind_id, offset)
    shape = [int(d) for d in reversed(dims)]
    floats = {0: np.float32, 1: np.float16, 28: np.float64}  # GGML F32, F16, F64: no package import needed
    if kind_id in floats:
        return raw.view(floats[kind_id]).astype(np.float32).reshape(shape)
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize
    kind = Q(kind_id)
    try:
        return dequantize(raw, kind).astype(np.float32, copy=False).reshape(shape)
    except NotImplementedError:
        raise CheckpointError(f"{reader.path}: tensor {name!r} uses quantization type {kind.name}, which the gguf "
                              "package cannot dequantize") from None


def _our_name(name: str) -> str | None:
    for pat, template in _PATTERNS:
        m = pat.match(name)
        if m:
            return template.replace("{i}", m.group(1)) if m.groups() else template
    return None


def load_gguf(path: str | Path, dtype: torch.dtype | None = None, device=None, quantized: bool = False):
    """A `CausalLM` with the file's weights dequantized to fp32 (then cast to `dtype` if given).

    quantized=True keeps Q4_0/Q4_1/Q8_0 matrices as their blocks, memory-mapped from the file, in
    `BlockLinear`/`BlockEmbedding` modules (attnlab/nn/quantized.py): no fp32 copy of them is ever made.
    Inference only, fp32 activations, CPU; other tensor types (norms, F16/F32 matrices) load as fp32."""
    from ..models.decoder import CausalLM
    path = Path(path)
    source = str(path)
    cfg = gguf_config(path)
    reader = _reader(str(path.resolve()))
    if quantized:
        from ..nn import quantized as q
        if not q.available():
            raise RuntimeError(f"{source}: quantized loading needs the block kernels, which could not be built "
                               f"({q.why_unavailable()}); load with quantized=False")
        if dtype not in (None, torch.float32) or (device is not None and torch.device(device).type != "cpu"):
            raise ValueError(f"{source}: quantized=True runs fp32 activations on the CPU (got dtype={dtype}, "
                             f"device={device})")
        # copy-on-write map: torch wants a writable buffer; nothing writes, so no page is ever copied
        cow = np.memmap(str(path), dtype=np.uint8, mode="c")
    check_shapes_before_allocating(reader, cfg, source)
    model = _skeleton(CausalLM, cfg)
    expected = dict(model.named_parameters())
    tensors: dict[str, torch.Tensor] = {}
    blocks: dict[str, tuple[torch.Tensor, int]] = {}  # our weight name -> (block rows, GGML type)
    unexpected = []
    for name, dims, kind, offset in reader.tensors:
        ours = _our_name(name)
        if ours is None or ours not in expected:
            if name not in IGNORED:
                unexpected.append(name)
            continue
        shape = tuple(int(d) for d in reversed(dims))
        heads = (cfg.num_heads if ours.endswith("attn.q.weight") else
                 cfg.kv_heads if ours.endswith("attn.k.weight") else None)
        if quantized and kind in q.BLOCK_TYPES and len(shape) == 2:
            _check_shape(source, name, shape, expected[ours], ours)
            raw = reader.tensor_bytes(name, dims, kind, offset)  # bounds-checked view of the header's mmap
            start = raw.ctypes.data - reader.buf.ctypes.data
            w = torch.from_numpy(cow[start:start + raw.size].reshape(raw.shape))
            if heads is not None:  # whole rows move, so the blocks permute like the dequantized rows
                w = unpermute_rope(w, heads).contiguous()
            blocks[ours] = (w, kind)
            continue
        w = torch.from_numpy(_dequantize(reader, name, dims, kind, offset))
        _check_shape(source, name, tuple(w.shape), expected[ours], ours)
        if heads is not None:
            w = unpermute_rope(w, heads)
        tensors[ours] = w
    if unexpected:
        raise CheckpointError(f"{source}: tensors with no counterpart in a {cfg.model_type} model: "
                              + ", ".join(unexpected[:6]))
    missing = [k for k in expected if k not in tensors and k not in blocks
               and not (k == "lm_head.weight" and cfg.tie_word_embeddings)]
    if missing:
        raise CheckpointError(f"{source}: missing tensors for " + ", ".join(missing[:6]))
    if blocks:
        _install_blocks(model, blocks, tensors)
    model.load_state_dict(tensors, strict=False, assign=True)
    model.backbone.rope = type(model.backbone.rope)(cfg.rotary_dim, cfg.rope_theta)  # rebuild buffer off meta
    if not blocks:
        model.tie_weights()
    if dtype is not None:
        model = model.to(dtype)
    if device is not None:
        model = model.to(device)
    return model.eval()


def _check_shape(source: str, name: str, shape: tuple, param: torch.Tensor, ours: str) -> None:
    if shape != tuple(param.shape):
        raise CheckpointError(f"{source}: tensor {name!r} has shape {shape}, expected {tuple(param.shape)} for {ours}")


def _skeleton(cls, cfg):
    """`cls(cfg)` with uninitialized parameters: the file provides the values. Built on the CPU with every
    initializer skipped, so the untouched allocations never become resident; not on the meta device,
    whose ops (normal_, arange) run through torch's Python reference kernels and import torch._dynamo
    and sympy on first use (+70 MB resident for nothing)."""
    from torch.nn import init
    names = ("normal_", "uniform_", "zeros_", "ones_", "kaiming_uniform_", "trunc_normal_", "xavier_uniform_")
    saved = {n: getattr(init, n) for n in names}
    try:
        for n in names:
            setattr(init, n, lambda tensor, *args, **kwargs: tensor)
        return cls(cfg)
    finally:
        for n, f in saved.items():
            setattr(init, n, f)


def _install_blocks(model, blocks: dict, tensors: dict) -> None:
    """Swap the modules whose weight stayed in blocks for their quantized counterparts (the tied LM head
    shares the embedding's blocks); a quantized embedding that cannot be gathered rowwise is an error."""
    from ..nn.quantized import BlockEmbedding, BlockLinear
    emb_name = "backbone.embeddings.tok.weight"
    cfg = model.config
    if cfg.tie_word_embeddings and emb_name in blocks:
        blocks.setdefault("lm_head.weight", blocks[emb_name])
    elif cfg.tie_word_embeddings and emb_name in tensors:  # fp32 embedding, tied head: plain tying
        tensors["lm_head.weight"] = tensors[emb_name]
    for ours, (w, kind) in blocks.items():
        parent_name, _, _ = ours.rpartition(".")  # "....attn.q" of "....attn.q.weight"
        owner_name, _, attr = parent_name.rpartition(".")
        owner = model.get_submodule(owner_name)
        old = getattr(owner, attr)
        if isinstance(old, nn.Embedding):
            new = BlockEmbedding(w, kind, old.num_embeddings, old.embedding_dim)
        else:
            new = BlockLinear(w, kind, old.in_features, old.out_features, name=ours)
        setattr(owner, attr, new)


