"""What a GGUF file says about its model, without torch: the config (`config_from_gguf`), the tensors' expected
shapes, llama.cpp's Q/K row order, and the tokenizer with its chat template.

`interop/gguf.py` builds a `CausalLM` from these; `inference/lean.py` decodes on the file's blocks directly,
before torch could even be imported (`attnlab generate` on a .gguf).
"""
from __future__ import annotations

import ctypes
from pathlib import Path

from .config import CheckpointError, ConfigError, ModelConfig, first_line
from .gguf_file import GGUFFile, StringArray, _reader

SUPPORTED_ARCHITECTURES = ("llama",)


def metadata(path: str | Path) -> dict:
    """All key/value metadata of a GGUF file as Python values (strings, numbers, lists)."""
    return _reader(str(Path(path).resolve())).meta


def config_from_gguf(meta: dict, source: str = "gguf") -> ModelConfig:
    try:
        return _config_from_gguf(meta, source)
    except ConfigError:
        raise
    except (TypeError, ValueError, OverflowError, ZeroDivisionError) as err:  # e.g. a string where a size belongs
        raise ConfigError(f"{source}: metadata value of the wrong type ({err})") from None


def _config_from_gguf(meta: dict, source: str) -> ModelConfig:
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ConfigError(f"{source}: general.architecture={arch!r} is not supported; "
                          f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}")

    def need(key: str, default=None):
        full = f"{arch}.{key}"
        if full not in meta and default is None:
            raise ConfigError(f"{source}: metadata key {full!r} is missing")
        value = meta.get(full, default)
        if type(value) is not int or value <= 0:  # a count: 0 would divide by zero, a float or list mislead
            raise ConfigError(f"{source}: metadata {full}={value!r:.60} must be a positive integer")
        return value

    hidden, heads = need("embedding_length"), need("attention.head_count")
    kv = need("attention.head_count_kv", heads)
    head_dim = need("rope.dimension_count", hidden // heads)
    if meta.get(f"{arch}.rope.scaling.type", "none") not in ("none", None):
        raise ConfigError(f"{source}: {arch}.rope.scaling.type={meta[f'{arch}.rope.scaling.type']!r} "
                          "is not supported")
    vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", []))
    tok = lambda key: meta.get(f"tokenizer.ggml.{key}")  # noqa: E731
    try:
        return ModelConfig(
            model_type="llama", vocab_size=int(vocab), hidden_size=hidden, num_layers=need("block_count"),
            num_heads=heads, num_kv_heads=kv, head_dim=head_dim,
            intermediate_size=need("feed_forward_length"),
            max_position_embeddings=need("context_length"), type_vocab_size=0, position="rope",
            norm="rmsnorm", norm_placement="pre", activation="swiglu", bias=False, causal=True,
            embedding_norm=False, final_norm=True, pooler=False, dropout=0.0, attention_dropout=0.0,
            norm_eps=float(meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
            rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
            pad_token_id=tok("padding_token_id"), bos_token_id=tok("bos_token_id"),
            eos_token_id=tok("eos_token_id"), tie_word_embeddings=True)
    except ConfigError as err:
        raise ConfigError(f"{source}: {str(err).removeprefix('config: ')}") from None


def gguf_config(path: str | Path) -> ModelConfig:
    path = Path(path)
    reader = _reader(str(path.resolve()))
    cfg = config_from_gguf(metadata(path), str(path))
    cfg.tie_word_embeddings = not any(t[0] == "output.weight" for t in reader.tensors)
    return cfg


def gguf_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """GGUF tensor name -> the shape (rows first) the LLaMA `CausalLM` of `cfg` holds it in."""
    h, q, kv, f = cfg.hidden_size, cfg.num_heads * cfg.dim_head, cfg.kv_heads * cfg.dim_head, cfg.intermediate_size
    shapes = {"token_embd.weight": (cfg.vocab_size, h), "output_norm.weight": (h,),
              "output.weight": (cfg.vocab_size, h)}
    for i in range(cfg.num_layers):
        shapes.update({f"blk.{i}.attn_norm.weight": (h,), f"blk.{i}.attn_q.weight": (q, h),
                       f"blk.{i}.attn_k.weight": (kv, h), f"blk.{i}.attn_v.weight": (kv, h),
                       f"blk.{i}.attn_output.weight": (h, q), f"blk.{i}.ffn_norm.weight": (h,),
                       f"blk.{i}.ffn_gate.weight": (f, h), f"blk.{i}.ffn_up.weight": (f, h),
                       f"blk.{i}.ffn_down.weight": (h, f)})
    return shapes


def check_shapes_before_allocating(reader: GGUFFile, cfg: ModelConfig, source: str) -> None:
    """The metadata's sizes against the file's tensors before the model is built: the skeleton takes 4 bytes
    a parameter, so a small file whose metadata claims a 40B model must fail here, not in the allocator.
    The tensors' own byte ranges were checked against the file size when the header was read; this ties
    the config to them (`_check_shape` still checks each loaded weight against the built model)."""
    if cfg.num_layers > len(reader.tensors):  # before building a table of num_layers entries
        raise CheckpointError(f"{source}: {cfg.num_layers} blocks in the metadata ({cfg.model_type}.block_count), "
                              f"{len(reader.tensors)} tensors in the file")
    want = gguf_shapes(cfg)
    have = {}
    for name, dims, _, _ in reader.tensors:
        have[name] = shape = tuple(int(d) for d in reversed(dims))
        if name in want and shape != want[name]:
            raise CheckpointError(f"{source}: tensor {name!r} has shape {shape}, the metadata's sizes need "
                                  f"{want[name]}")
    missing = [n for n in want if n not in have and n != "output.weight"]
    if missing:
        raise CheckpointError(f"{source}: missing tensors " + ", ".join(missing[:6]))


def unpermute_rope(w, heads: int):
    """Invert llama.cpp's Q/K row order: per head, rows (0, d/2, 1, d/2+1, ...) back to (0, 1, ..., d-1).
    Any array with `reshape` and `swapaxes` (a torch tensor, a numpy array of block rows)."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# ----------------------------------------------------------------------------------- tokenizer
_TOKEN_CONTROL, _TOKEN_USER = 3, 4  # llama.cpp token types (1 = normal, 6 = byte, ...)


def tokenizer_from_gguf(path: str | Path):
    """The file's byte-level BPE tokenizer (GPT-2 style: tokens + merges) as an attnlab Tokenizer, with the
    chat template from the metadata in `.chat_template`."""
    path = Path(path)
    meta = metadata(path)
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ConfigError(f"{path}: tokenizer.ggml.model={kind!r} is not supported (only 'gpt2': byte-level BPE)")
    # long string arrays come as compact StringArrays (gguf_file.py): lists only while the tokenizer is built
    raw = {key: meta.get(f"tokenizer.ggml.{key}") or [] for key in ("tokens", "merges")}
    tokens, merges = (v.tolist() if isinstance(v, StringArray) else v for v in raw.values())
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    for key, values, kind in (("tokens", tokens, str), ("merges", merges, str), ("token_type", types, int)):
        if isinstance(raw.get(key), StringArray):
            continue  # strings by construction
        if not isinstance(values, list) or not all(type(v) is kind for v in values):
            raise CheckpointError(f"{path}: tokenizer.ggml.{key} must be a list of {kind.__name__}")
    if len(types) != len(tokens):
        raise CheckpointError(f"{path}: tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
    bad = next((m for m in merges if " " not in m), None)
    if bad is not None:
        raise CheckpointError(f"{path}: tokenizer.ggml.merges: {bad!r:.40} is not two tokens separated by a space")
    try:
        tokenizer = _gguf_tokenizer(path, meta, tokens, merges, types)
        del tokens, merges, types
        _return_freed_memory()
        return tokenizer
    except (ConfigError, CheckpointError):
        raise
    except BaseException as err:  # the Rust library's errors (and panics) name no file; values of the wrong type
        if not isinstance(err, Exception) and type(err).__name__ != "PanicException":
            raise  # KeyboardInterrupt, SystemExit
        raise CheckpointError(f"{path}: tokenizer metadata the tokenizer cannot be built from "
                              f"({type(err).__name__}: {first_line(err):.200})") from None


def _return_freed_memory() -> None:
    """Building the tokenizer makes ~10 MB of short-lived Python objects (the vocabulary as a dict, the merges
    as pairs); glibc keeps the freed heap and the process's RSS stays that much higher for its whole life
    (measured on `generate --chat`). malloc_trim hands it back; elsewhere than glibc this does nothing."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _gguf_tokenizer(path: Path, meta: dict, tokens: list, merges: list, types: list):
    import tokenizers as tk

    from .tokenizers import Tokenizer
    vocab = {t: i for i, t in enumerate(tokens)}
    backend = tk.Tokenizer(tk.models.BPE(vocab, [tuple(m.split(" ", 1)) for m in merges], fuse_unk=False,
                                         byte_fallback=False))
    byte_level = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if meta.get("tokenizer.ggml.pre") == "smollm":  # SmolLM splits numbers into single digits
        backend.pre_tokenizer = tk.pre_tokenizers.Sequence(
            [tk.pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        backend.pre_tokenizer = byte_level
    backend.decoder = tk.decoders.ByteLevel()
    backend.add_special_tokens([tk.AddedToken(t, special=True, normalized=False)
                                for t, ty in zip(tokens, types) if ty == _TOKEN_CONTROL])
    backend.add_tokens([tk.AddedToken(t, normalized=False) for t, ty in zip(tokens, types) if ty == _TOKEN_USER])
    specials = {}
    for role, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                      ("unk_token", "unknown_token_id"), ("pad_token", "padding_token_id")):
        i = meta.get(f"tokenizer.ggml.{key}")
        if i is not None and type(i) is not int:
            raise CheckpointError(f"{path}: tokenizer.ggml.{key}={i!r:.40} is not a token id")
        if i is not None and 0 <= int(i) < len(tokens):
            specials[role] = tokens[int(i)]
    if meta.get("tokenizer.ggml.add_bos_token") and "bos_token" in specials:
        bos = specials["bos_token"]
        backend.post_processor = tk.processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab[bos])])
    arch = meta.get("general.architecture", "")
    template = meta.get("tokenizer.chat_template")
    if template is not None and not isinstance(template, str):
        raise CheckpointError(f"{path}: tokenizer.chat_template must be a string")
    tok = Tokenizer(backend, specials=specials, name=str(path),
                    model_max_length=int(meta.get(f"{arch}.context_length", 2048)))
    tok.chat_template = template
    return tok
