"""Linear layers and embeddings that keep llama.cpp's block-quantized weights (Q4_0, Q4_1, Q8_0) as they
are in the file and multiply with them directly, instead of holding a dequantized fp32 copy.

SmolLM2-135M Q4_1 is 92 MB of blocks but 538 MB as fp32; a decoding step reads every weight once, so
reading 4.5-bit blocks instead of 32-bit floats is most of the speed-up at batch 1. The products run in
`csrc/ggml_blocks.c` (blocks widened in registers against fp32 activations; in the batch-1 decode step,
where the CPU has AVX512-VNNI, each activation row is quantized to int8 per block of 32 for integer dot
products, as llama.cpp does: `exact_products` turns that off; see the file's header for the layouts),
built once per machine with the system C compiler (about a second, `cc -O3 -march=native`) into
`~/.cache/attnlab/kernels/` (or $ATTNLAB_CACHE/kernels) and called through ctypes. With no C compiler,
`available()` is False and GGUF files load dequantized to fp32 as before.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torch import nn

from .precision import cache_root, cpu_key

# GGML type id -> (name, bytes per block of 32 weights)
BLOCK_TYPES = {2: ("Q4_0", 18), 3: ("Q4_1", 20), 8: ("Q8_0", 34)}
# every C kernel of the package, built into one library: the GGUF block products here, the int8 rows of
# nn/int8.py, the short-sequence and bf16 causal attention of nn/cpu_attention.py and the one-pass rows of
# nn/fused.py (csrc/*.h: included by them)
_SOURCES = [Path(__file__).with_name("csrc") / name
            for name in ("ggml_blocks.c", "int8_rows.c", "short_attention.c", "fused_rows.c", "causal_attention.c")]
# From this many input rows on, BlockLinear dequantizes weight tiles and multiplies with torch's GEMM; below,
# the block kernel's dot products (batch-1 decoding reads each weight once: bytes moved dominate).
GEMM_ROWS = 64
_TILE_WEIGHTS = 1 << 20  # weights dequantized at a time (4 MB fp32): every SmolLM2 matrix but the LM head
_lib = None
_error: str | None = None
_pool: ThreadPoolExecutor | None = None


def _build() -> ctypes.CDLL:
    headers = sorted(_SOURCES[0].parent.glob("*.h"))  # included by the sources: a change must rebuild too
    src = b"".join(path.read_bytes() for path in [*_SOURCES, *headers])
    tag = hashlib.sha256(src + cpu_key().encode()).hexdigest()[:16]
    out = cache_root() / "kernels" / f"attnlab-kernels-{tag}.so"
    if not out.exists():
        cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
        if cc is None:
            raise OSError("no C compiler (cc/gcc/clang) found")
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:  # build aside, rename: safe for parallel runs
            tmp_so = Path(tmp) / out.name
            cmd = [cc, "-O3", "-march=native", "-shared", "-fPIC", "-o", str(tmp_so), *map(str, _SOURCES), "-lm"]
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode:
                raise OSError(f"{' '.join(cmd)} failed: {res.stderr.strip()[-400:]}")
            os.replace(tmp_so, out)
    lib = ctypes.CDLL(str(out))
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.ggml_matmul.argtypes = [ctypes.c_int, p, i64, i64, p, i64, p]
    lib.ggml_rows.argtypes = [ctypes.c_int, p, i64, p, i64, p]
    lib.ggml_rows_bf16.argtypes = [ctypes.c_int, p, i64, p, i64, p]
    lib.ggml_exact.argtypes = [ctypes.c_int]
    lib.ggml_matvec_step.argtypes = [ctypes.c_int, p, i64, p, i64, p]
    if os.environ.get("ATTNLAB_GGUF_EXACT") == "1":
        lib.ggml_exact(1)
    i32, f32 = ctypes.c_int, ctypes.c_float
    lib.llama_decode_step.argtypes = [i32, p, p, p, i32, i32, i32, i32, i32, f32, f32, i64, i64, p, p, p]
    lib.int8_quantize_rows.argtypes = [p, p, i64, i64, p, p]
    lib.int8_dequant_rows.argtypes = [p, p, p, p, i64, i64]
    lib.short_attention.argtypes = [p, p, p, p, p, p, i64, i64, i64, i64, i64, i64, p, f32, p, i64, i64]
    lib.short_attention_supported.restype = i32
    lib.silu_mul_rows.argtypes = [p, p, p, i32, i64, i64]
    lib.rms_norm_rows.argtypes = [p, p, p, i64, f32, i32, i64, i64]
    lib.rope_rows.argtypes = [p, p, p, p, i64, i32, p, p, i64, i64, i64, i32, i64, i64]
    lib.lse_tile_rows.argtypes = [p, i64, i32, p, i64, p, p, p, i64, i64]
    lib.causal_attention_supported.restype = i32
    lib.causal_attention_bf16.argtypes = [p, p, p, p, p, p, p, p, i64, i64, i64, i64, f32, i64, i64]
    lib.causal_attention_bf16.restype = i32
    return lib


def kernels():
    """The compiled kernels (built on first use), or None when they cannot be built (see `why_unavailable`)."""
    global _lib, _error
    if _lib is None and _error is None:
        try:
            _lib = _build()
        except OSError as err:
            _error = str(err)
    return _lib


@contextlib.contextmanager
def exact_products(on: bool = True):
    """Within the block, the batch-1 decode step (inference/block_step.py) multiplies in fp32 against the
    widened weights (the dequantized product to rounding) instead of its default integer path, which
    quantizes each activation row to int8 per block of 32 as llama.cpp does (~1.5x faster products on a CPU
    with AVX512-VNNI; see csrc/ggml_blocks.c). Everything else (prompts, the LM head, BlockLinear called
    from Python) is exact either way. ATTNLAB_GGUF_EXACT=1 (or `generate --exact`) makes exact the default."""
    lib = kernels()
    old = lib.ggml_exact(int(on)) if lib is not None else 1
    try:
        yield
    finally:
        if lib is not None:
            lib.ggml_exact(old)


def split_rows(call, rows: int, min_rows: int = 1) -> None:
    """call(start, end) over [0, rows), split across torch's intra-op thread count (at least `min_rows` each):
    a kernel call releases the GIL (ctypes), so the threads run in parallel."""
    threads = max(1, min(torch.get_num_threads(), rows // max(1, min_rows)))
    if threads == 1:
        call(0, rows)
        return
    global _pool
    if _pool is None or _pool._max_workers < threads:
        _pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="attnlab-kernels")
    cuts = [rows * i // threads for i in range(threads + 1)]
    list(_pool.map(lambda i: call(cuts[i], cuts[i + 1]), range(threads)))


def available() -> bool:
    return kernels() is not None


def why_unavailable() -> str | None:
    kernels()
    return _error


def _check_blocks(blocks: torch.Tensor, kind: int, rows: int, cols: int, what: str) -> None:
    if kind not in BLOCK_TYPES:
        raise ValueError(f"{what}: GGML type {kind} is not a supported block type "
                         f"({', '.join(n for n, _ in BLOCK_TYPES.values())})")
    name, size = BLOCK_TYPES[kind]
    if cols % 32:
        raise ValueError(f"{what}: row length {cols} is not a multiple of the {name} block size 32")
    want = (rows, cols // 32 * size)
    if blocks.dtype != torch.uint8 or tuple(blocks.shape) != want or not blocks.is_contiguous():
        raise ValueError(f"{what}: {name} blocks must be a contiguous uint8 tensor of shape {want}, "
                         f"got {blocks.dtype} {tuple(blocks.shape)}")


class BlockLinear(nn.Module):
    """y = x W^T (+ bias) with W (out_features, in_features) stored as GGML blocks, one row of blocks per
    output feature. `blocks` may be a view into a memory-mapped file: it is only ever read."""

    def __init__(self, blocks: torch.Tensor, kind: int, in_features: int, out_features: int,
                 bias: torch.Tensor | None = None, name: str = "weight") -> None:
        super().__init__()
        _check_blocks(blocks, kind, out_features, in_features, name)
        self.in_features, self.out_features, self.kind = in_features, out_features, kind
        self.register_buffer("blocks", blocks, persistent=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {BLOCK_TYPES[self.kind][0]}"

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized (out, in) fp32 matrix: built on each access, for inspection and tests only."""
        return dequantize_rows(self.blocks, self.kind, self.in_features,
                               torch.arange(self.out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lib = kernels()
        if lib is None:
            raise RuntimeError(f"quantized GGUF kernels unavailable: {_error}")
        if x.size(-1) != self.in_features:
            raise ValueError(f"BlockLinear: input has {x.size(-1)} features, expected {self.in_features}")
        if torch.is_grad_enabled() and x.requires_grad:
            raise RuntimeError("BlockLinear is inference-only (no gradients through quantized blocks)")
        shape = x.shape
        x2 = x.reshape(-1, self.in_features)
        if x2.size(0) >= GEMM_ROWS:
            out = self._gemm(x2)
            if self.bias is not None:
                out += self.bias.to(out.dtype)
            return out.view(*shape[:-1], self.out_features).to(x.dtype)
        if x2.dtype != torch.float32 or not x2.is_contiguous():
            x2 = x2.to(torch.float32).contiguous()
        m = x2.size(0)
        out = torch.empty(m, self.out_features, dtype=torch.float32)
        lib.ggml_matmul(self.kind, x2.data_ptr(), m, self.in_features, self.blocks.data_ptr(), self.out_features,
                        out.data_ptr())
        if self.bias is not None:
            out += self.bias
        out = out.view(*shape[:-1], self.out_features)
        return out if x.dtype == torch.float32 else out.to(x.dtype)


    def dequantized(self, start: int, end: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Weight rows start..end-1 (output features) as an (end - start, in_features) fp32 or bf16 tile."""
        return dequantize_rows(self.blocks, self.kind, self.in_features, torch.arange(start, end), dtype)

    def _gemm(self, x: torch.Tensor) -> torch.Tensor:
        """Many rows (a prompt, perplexity windows): dequantize a tile of weight rows at a time and hand it to
        torch's GEMM. Each dequantized weight then serves every input row, where the block kernel above
        re-widens each block for each 8 rows; the tile, not the whole matrix, is ever held in floats.
        bf16 inputs get bf16 tiles (native bf16 dot products where the CPU has them)."""
        dtype = torch.bfloat16 if x.dtype == torch.bfloat16 else torch.float32
        x = x.to(dtype)
        step = max(1, _TILE_WEIGHTS // self.in_features)
        parts = []
        for n0 in range(0, self.out_features, step):
            parts.append(x @ self.dequantized(n0, min(n0 + step, self.out_features), dtype).T)
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def dequantize_rows(blocks: torch.Tensor, kind: int, cols: int, ids: torch.Tensor,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rows `ids` of a block-quantized (rows, cols) matrix, shape (*ids.shape, cols), in fp32 or bf16 (rounded
    as torch casts fp32 to bf16, written directly: no fp32 tile to allocate and cast)."""
    lib = kernels()
    if lib is None:
        raise RuntimeError(f"quantized GGUF kernels unavailable: {_error}")
    flat = ids.reshape(-1).to(torch.int64).contiguous()
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= blocks.size(0)):
        raise IndexError(f"token id out of range [0, {blocks.size(0)})")
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"dequantize_rows: dtype must be float32 or bfloat16, got {dtype}")
    out = torch.empty(flat.numel(), cols, dtype=dtype)
    rows = lib.ggml_rows if dtype == torch.float32 else lib.ggml_rows_bf16
    rows(kind, blocks.data_ptr(), cols, flat.data_ptr(), flat.numel(), out.data_ptr())
    return out.view(*ids.shape, cols)


class BlockEmbedding(nn.Module):
    """A token embedding whose table stays in GGML blocks: each lookup dequantizes only the rows it needs."""

    def __init__(self, blocks: torch.Tensor, kind: int, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        _check_blocks(blocks, kind, num_embeddings, embedding_dim, "token embedding")
        self.num_embeddings, self.embedding_dim, self.kind = num_embeddings, embedding_dim, kind
        self.register_buffer("blocks", blocks, persistent=False)
        # an empty float buffer that `model.to(torch.bfloat16)` converts like every float tensor: the rows come
        # out in its dtype, so a bf16 model's activations are bf16 from the first layer on
        self.register_buffer("out_dtype", torch.empty(0), persistent=False)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {BLOCK_TYPES[self.kind][0]}"

    @property
    def weight(self) -> torch.Tensor:
        return dequantize_rows(self.blocks, self.kind, self.embedding_dim, torch.arange(self.num_embeddings))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return dequantize_rows(self.blocks, self.kind, self.embedding_dim, ids).to(self.out_dtype.dtype)
