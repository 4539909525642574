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

import functools
import re
import struct
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..config import ConfigError, ModelConfig
from .files import CheckpointError

SUPPORTED_ARCHITECTURES = ("llama",)

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


class GGUFFile:
    """The parts of a GGUF file we need: metadata as Python values and where each tensor's bytes are.

    Parsed here with `struct` (the layout is a short header, key/values, tensor infos, aligned data)
    because `gguf.GGUFReader` builds objects for each of the ~100k tokenizer strings and takes seconds;
    the tensors themselves are dequantized by the `gguf` package.
    """

    _SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
    _NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
              7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self.buf = np.memmap(path, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as err:
            raise CheckpointError(f"{path}: cannot read ({err})") from None
        self.mv = memoryview(self.buf)
        self.pos = 0
        try:
            magic, version = self._take("<4sI")
            if magic != b"GGUF" or version not in (2, 3):
                raise CheckpointError(f"{path}: not a GGUF v2/v3 file (magic {magic!r}, version {version})")
            n_tensors, n_kv = self._take("<QQ")
            self.meta = {}
            self.types = {}  # key -> (GGUF value type, element type of an array or None): a writer copies them
            for _ in range(n_kv):
                key = self._string()
                (kind,) = self._take("<I")
                inner = None
                if kind == 9 and self.pos + 4 <= len(self.buf):
                    inner = struct.unpack_from("<I", self.mv, self.pos)[0]
                self.meta[key] = self._value(kind)
                self.types[key] = (kind, inner)
            self.tensors = []  # (name, dims in ggml order (fastest first), ggml type, offset)
            for _ in range(n_tensors):
                name = self._string()
                (n_dims,) = self._take("<I")
                if not 1 <= n_dims <= self.MAX_DIMS:
                    raise CheckpointError(f"{path}: tensor {name!r} has {n_dims} dimensions (GGUF allows 1 to "
                                          f"{self.MAX_DIMS}): damaged file")
                dims = list(self._take(f"<{n_dims}Q"))
                kind, offset = self._take("<IQ")
                self.tensors.append((name, dims, kind, offset))
        except (struct.error, UnicodeDecodeError, IndexError, ValueError) as err:
            if isinstance(err, CheckpointError):
                raise
            raise CheckpointError(f"{path}: damaged or truncated GGUF header ({err})") from None
        align = self.meta.get("general.alignment", 32)
        if type(align) is not int or align <= 0 or align & (align - 1):
            raise CheckpointError(f"{path}: general.alignment={align!r} is not a power of two")
        self.data_start = (self.pos + align - 1) // align * align

    MAX_DIMS = 4  # GGML_MAX_DIMS

    def _need(self, n: int) -> None:
        """Bounds check: `n` more bytes must lie inside the file."""
        if n < 0 or self.pos + n > len(self.buf):
            raise CheckpointError(f"{self.path}: truncated GGUF file (needs {n} bytes at offset {self.pos}, "
                                  f"the file has {len(self.buf)})")

    def _take(self, fmt: str) -> tuple:
        self._need(struct.calcsize(fmt))
        values = struct.unpack_from(fmt, self.mv, self.pos)
        self.pos += struct.calcsize(fmt)
        return values

    def _string(self) -> str:
        (n,) = self._take("<Q")
        self._need(n)
        text = bytes(self.mv[self.pos:self.pos + n]).decode("utf-8")
        self.pos += n
        return text

    def _value(self, kind: int):
        if kind == 8:
            return self._string()
        if kind in self._SCALARS:
            return self._take(self._SCALARS[kind])[0]
        if kind == 9:
            inner, count = self._take("<IQ")
            if inner in self._NUMPY:  # numeric arrays in one read
                dtype = np.dtype(self._NUMPY[inner])
                self._need(count * dtype.itemsize)
                arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos)
                self.pos += count * dtype.itemsize
                return arr.tolist()
            return [self._value(inner) for _ in range(count)]
        raise CheckpointError(f"{self.path}: unknown GGUF value type {kind}")

    def tensor_bytes(self, name: str, dims: list[int], kind: int, offset: int) -> np.ndarray:
        """Raw bytes of a tensor as (rows, bytes per row), after checking they lie inside the file."""
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q
        try:
            block, size = GGML_QUANT_SIZES[Q(kind)]
        except (ValueError, KeyError):
            raise CheckpointError(f"{self.path}: tensor {name!r} has unknown GGML tensor type {kind}") from None
        if dims[0] % block:
            raise CheckpointError(f"{self.path}: tensor {name!r}: row length {dims[0]} is not a multiple of the "
                                  f"{Q(kind).name} block size {block}")
        rows = 1
        for d in dims[1:]:
            rows *= int(d)
        row_bytes = dims[0] // block * size
        start = self.data_start + offset
        end = start + rows * row_bytes
        if end > len(self.buf):
            raise CheckpointError(f"{self.path}: tensor {name!r} (shape {list(reversed(dims))}, {Q(kind).name}) "
                                  f"needs bytes {start}..{end}, the file has {len(self.buf)}: truncated or damaged")
        return self.buf[start:end].reshape(rows, row_bytes)


@functools.lru_cache(maxsize=4)
def _reader(path: str) -> GGUFFile:
    try:
        import gguf  # noqa: F401  (dequantization and type sizes)
    except ImportError:
        raise ImportError("reading .gguf files needs the gguf package: pip install gguf") from None
    return GGUFFile(path)


def metadata(path: str | Path) -> dict:
    """All key/value metadata of a GGUF file as Python values (strings, numbers, lists)."""
    return _reader(str(Path(path).resolve())).meta


def config_from_gguf(meta: dict, source: str = "gguf") -> ModelConfig:
    try:
        return _config_from_gguf(meta, source)
    except ConfigError:
        raise
    except (TypeError, ValueError, OverflowError) as err:  # e.g. a string where a size belongs
        raise ConfigError(f"{source}: metadata value of the wrong type ({err})") from None


def _config_from_gguf(meta: dict, source: str) -> ModelConfig:
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ConfigError(f"{source}: general.architecture={arch!r} is not supported; "
                          f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}")

    def need(key: str):
        full = f"{arch}.{key}"
        if full not in meta:
            raise ConfigError(f"{source}: metadata key {full!r} is missing")
        return meta[full]

    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    kv = meta.get(f"{arch}.attention.head_count_kv", heads)
    head_dim = int(meta.get(f"{arch}.rope.dimension_count", hidden // heads))
    if meta.get(f"{arch}.rope.scaling.type", "none") not in ("none", None):
        raise ConfigError(f"{source}: {arch}.rope.scaling.type={meta[f'{arch}.rope.scaling.type']!r} "
                          "is not supported")
    vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", []))
    tok = lambda key: meta.get(f"tokenizer.ggml.{key}")  # noqa: E731
    try:
        return ModelConfig(
            model_type="llama", vocab_size=int(vocab), hidden_size=hidden, num_layers=int(need("block_count")),
            num_heads=heads, num_kv_heads=int(kv), head_dim=head_dim,
            intermediate_size=int(need("feed_forward_length")),
            max_position_embeddings=int(need("context_length")), type_vocab_size=0, position="rope",
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


def _dequantize(reader: GGUFFile, name: str, dims: list[int], kind_id: int, offset: int) -> np.ndarray:
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize
    raw = reader.tensor_bytes(name, dims, kind_id, offset)
    kind = Q(kind_id)
    shape = [int(d) for d in reversed(dims)]
    if kind in (Q.F32, Q.F16, Q.F64):
        dtype = {Q.F32: np.float32, Q.F16: np.float16, Q.F64: np.float64}[kind]
        return raw.view(dtype).astype(np.float32).reshape(shape)
    try:
        return dequantize(raw, kind).astype(np.float32, copy=False).reshape(shape)
    except NotImplementedError:
        raise CheckpointError(f"{reader.path}: tensor {name!r} uses quantization type {kind.name}, which the gguf "
                              "package cannot dequantize") from None


def unpermute_rope(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Invert llama.cpp's Q/K row order: per head, rows (0, d/2, 1, d/2+1, ...) back to (0, 1, ..., d-1)."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


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


# ----------------------------------------------------------------------------------- tokenizer
_TOKEN_CONTROL, _TOKEN_USER = 3, 4  # llama.cpp token types (1 = normal, 6 = byte, ...)


def tokenizer_from_gguf(path: str | Path):
    """The file's byte-level BPE tokenizer (GPT-2 style: tokens + merges) as an attnlab Tokenizer, with the
    chat template from the metadata in `.chat_template`."""
    import tokenizers as tk

    from ..tokenizers import Tokenizer
    path = Path(path)
    meta = metadata(path)
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ConfigError(f"{path}: tokenizer.ggml.model={kind!r} is not supported (only 'gpt2': byte-level BPE)")
    tokens = meta.get("tokenizer.ggml.tokens") or []
    merges = meta.get("tokenizer.ggml.merges") or []
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
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
        if i is not None and 0 <= int(i) < len(tokens):
            specials[role] = tokens[int(i)]
    if meta.get("tokenizer.ggml.add_bos_token") and "bos_token" in specials:
        bos = specials["bos_token"]
        backend.post_processor = tk.processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab[bos])])
    arch = meta.get("general.architecture", "")
    tok = Tokenizer(backend, specials=specials, name=str(path),
                    model_max_length=int(meta.get(f"{arch}.context_length", 2048)))
    tok.chat_template = meta.get("tokenizer.chat_template")
    return tok
