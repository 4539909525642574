"""GGUF out: write a LLaMA-style `CausalLM` as a llama.cpp `.gguf` file, in F32, F16, Q8_0 or Q4_0.

The inverse of `interop/gguf.py`: our parameter names map back through `NAMES`, the rows of Q and K are
permuted back to llama.cpp's RoPE order (adjacent pairs), and the weights are block-quantized by the `gguf`
package (ggml's reference formats: Q8_0 = 32 int8 weights and one fp16 scale, 8.5 bits a weight; Q4_0 =
32 4-bit weights and one fp16 scale, 4.5 bits a weight). Norm weights stay F32, as llama.cpp keeps them.
With a 4-bit type the token embedding (also the LM head when tied) is written Q8_0, as llama.cpp's own
quantizer keeps that tensor at a higher precision; the packaged SmolLM2 file does the same (Q4_1 + Q8_0).

The tokenizer is not rebuilt from attnlab's: its `tokenizer.*` metadata (tokens, merges, types, special
ids, chat template) is copied, types and all, from the GGUF file given as `like` — normally the file the
model was loaded from. llama.cpp's `llama-perplexity` loads what this writes (benchmarks/lm_perplexity.py).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..config import ConfigError
from .files import CheckpointError, atomic_write
from .gguf import NAMES, SUPPORTED_ARCHITECTURES, StringArray, _reader

QTYPES = ("F32", "F16", "Q8_0", "Q4_0")
_FILE_TYPE = {"F32": 0, "F16": 1, "Q4_0": 2, "Q8_0": 7}  # llama.cpp's LLAMA_FTYPE_ALL_F32, MOSTLY_F16, ...
_BLOCK = 32  # Q8_0 / Q4_0 weights per block


def permute_rope(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Our Q/K row order (rotate half: i pairs with i + d/2) to llama.cpp's (i pairs with i + 1), per head;
    the inverse of `gguf.unpermute_rope`."""
    rows = w.shape[0]
    return w.reshape(heads, 2, rows // heads // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _check_model(model) -> None:
    cfg = model.config
    wanted = {"model_type": "llama", "position": "rope", "norm": "rmsnorm", "norm_placement": "pre",
              "activation": "swiglu", "bias": False, "causal": True}
    for field, value in wanted.items():
        if getattr(cfg, field) != value:
            raise ConfigError(f"save_gguf: writes LLaMA-style decoders only ({', '.join(SUPPORTED_ARCHITECTURES)}); "
                              f"this model has {field}={getattr(cfg, field)!r}, GGUF 'llama' needs {value!r}")
    if not hasattr(model, "lm_head"):
        raise ConfigError(f"save_gguf: a {type(model).__name__} has no language-model head to write")


def _our_to_gguf(num_layers: int) -> dict[str, str]:
    names = {}
    for theirs, ours in NAMES:
        if "{i}" in ours:
            for i in range(num_layers):
                names[ours.replace("{i}", str(i))] = theirs.replace("{i}", str(i))
        else:
            names[ours] = theirs
    return names


def _encode(w: np.ndarray, qtype: str, name: str):
    """(data, raw_dtype) for GGUFWriter.add_tensor: F32/F16 as arrays, block types as quantized bytes."""
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import quantize
    if qtype == "F32":
        return w.astype(np.float32), None
    if qtype == "F16":
        return w.astype(np.float16), None
    if w.shape[-1] % _BLOCK:
        raise CheckpointError(f"save_gguf: tensor {name!r} has rows of {w.shape[-1]} values, not a multiple of "
                              f"the {qtype} block size {_BLOCK}")
    kind = Q[qtype]
    return quantize(w.astype(np.float32), kind), kind


def save_gguf(model, path: str | Path, qtype: str = "Q8_0", *, like: str | Path) -> Path:
    """Write `model` (a LLaMA-style CausalLM) to `path` with its matrices in `qtype`, the tokenizer metadata
    taken from the GGUF file `like`. Returns the path. Written atomically."""
    import gguf
    if qtype not in QTYPES:
        raise ValueError(f"save_gguf: qtype must be one of {', '.join(QTYPES)}, got {qtype!r}")
    _check_model(model)
    cfg = model.config
    path, like = Path(path), Path(like)
    source = _reader(str(like.resolve()))
    if not any(k.startswith("tokenizer.") for k in source.meta):
        raise CheckpointError(f"save_gguf: {like} has no tokenizer metadata to copy")
    if source.meta.get("llama.vocab_size", len(source.meta.get("tokenizer.ggml.tokens", []))) != cfg.vocab_size:
        raise CheckpointError(f"save_gguf: {like}'s tokenizer has "
                              f"{len(source.meta.get('tokenizer.ggml.tokens', []))} tokens, the model "
                              f"{cfg.vocab_size}: not the model's tokenizer")
    embed_qtype = "Q8_0" if qtype == "Q4_0" else qtype

    def write(tmp: str) -> None:
        w = gguf.GGUFWriter(tmp, "llama")
        w.add_name(str(source.meta.get("general.name", path.stem)))
        w.add_file_type(_FILE_TYPE[qtype])
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        w.add_context_length(cfg.max_position_embeddings)
        w.add_embedding_length(cfg.hidden_size)
        w.add_block_count(cfg.num_layers)
        w.add_feed_forward_length(cfg.intermediate_size)
        w.add_head_count(cfg.num_heads)
        w.add_head_count_kv(cfg.kv_heads)
        w.add_rope_dimension_count(cfg.dim_head)
        w.add_rope_freq_base(float(cfg.rope_theta))
        w.add_layer_norm_rms_eps(float(cfg.norm_eps))
        w.add_vocab_size(cfg.vocab_size)
        for key, value in source.meta.items():
            if key.startswith("tokenizer."):
                kind, inner = source.types[key]
                value = list(value) if isinstance(value, StringArray) else value  # the writer takes lists
                w.add_key_value(key, value, gguf.GGUFValueType(kind),
                                sub_type=None if inner is None else gguf.GGUFValueType(inner))
        names = _our_to_gguf(cfg.num_layers)
        state = model.state_dict()
        tied = cfg.tie_word_embeddings
        for ours, tensor in state.items():
            if ours == "lm_head.weight" and tied:
                continue
            if ours not in names:
                if ours.endswith("inv_freq"):  # RoPE's buffer: llama.cpp recomputes it from freq_base
                    continue
                raise CheckpointError(f"save_gguf: parameter {ours!r} has no GGUF name")
            t = tensor.detach().float().cpu()
            if ours.endswith("attn.q.weight"):
                t = permute_rope(t, cfg.num_heads)
            elif ours.endswith("attn.k.weight"):
                t = permute_rope(t, cfg.kv_heads)
            arr = t.numpy()
            kind = "F32" if arr.ndim == 1 else embed_qtype if names[ours] in ("token_embd.weight", "output.weight") \
                else qtype
            data, raw = _encode(arr, kind, names[ours])
            if raw is None:
                w.add_tensor(names[ours], data)
            else:
                w.add_tensor(names[ours], data, raw_dtype=raw)  # shape read from the block bytes
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, write)
    return path
