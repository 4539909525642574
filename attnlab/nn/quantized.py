"""Linear layers and embeddings that keep llama.cpp's block-quantized weights (Q4_0, Q4_1, Q8_0) as they
are in the file and multiply with them directly, instead of holding a dequantized fp32 copy.

SmolLM2-135M Q4_1 is 92 MB of blocks but 538 MB as fp32; a decoding step reads every weight once, so
reading 4.5-bit blocks instead of 32-bit floats is most of the speed-up at batch 1. The products run in
`csrc/ggml_blocks.c` (blocks widened in registers against fp32 activations; in the batch-1 decode step,
where the CPU has AVX512-VNNI or AVX2, each activation row is quantized to int8 per block of 32 for integer
dot products, as llama.cpp does: `exact_products` turns that off; see the file's header for the layouts),
built once per machine with the system C compiler and called through the checked door of nn/kernels.py.
With no C compiler, `available()` is False, GGUF files load dequantized to fp32 as before, and these
modules (built by hand) dequantize tiles with torch's ops: same numbers, slower.
"""
from __future__ import annotations

import contextlib
import os

import torch
from torch import nn

from . import kernels as door
from .kernel_signatures import BLOCK_BYTES
from .kernels import split_rows  # noqa: F401  (re-exported: callers split their rows the same way)
from .precision import cpu_flags

# GGML type id -> (name, bytes per block of 32 weights)
BLOCK_TYPES = {kind: (name, BLOCK_BYTES[kind]) for kind, name in ((2, "Q4_0"), (3, "Q4_1"), (8, "Q8_0"))}
# From how many input rows BlockLinear dequantizes weight tiles and multiplies with torch's GEMM, per path of
# the C file (below it, the block kernel: batch-1 decoding reads each weight once, bytes moved dominate).
# AVX512: 64, tuned there. AVX2 (Zen 3), kernel vs dequantized tiles + GEMM over a SmolLM2 layer's seven Q4_1
# matrices, the kernel's columns split over threads as the GEMM's are: 2 threads 1.9x / 1.3x / 1.1x faster at
# 32 / 64 / 96 rows, 0.93x at 128; one thread 1.4x at 32, 1.1-1.5x at 64-96, 0.85x at 128: so 96. The portable C
# loop loses to the GEMM already at one row.
_GEMM_ROWS_BY_PATH = {"avx512-vnni": 64, "avx512": 64, "avx2": 96, "portable": 1}


def block_path(flags: set[str] | None = None) -> str:
    """The path of csrc/ggml_blocks.c that the build for a CPU with these flags (default: this one's) takes:
    "avx512-vnni", "avx512", "avx2" (each with FMA and F16C) or "portable" (also where the flags are unknown:
    the build is then portable too). The VNNI and AVX2 paths have the integer decode step."""
    flags = cpu_flags() if flags is None else flags
    if "avx512f" in flags:
        return "avx512-vnni" if {"avx512_vnni", "avx512vl"} <= flags else "avx512"
    return "avx2" if {"avx2", "fma", "f16c"} <= flags else "portable"


def gemm_rows(flags: set[str] | None = None) -> int:
    """From how many input rows BlockLinear uses torch's GEMM on tiles rather than the block kernel."""
    return _GEMM_ROWS_BY_PATH[block_path(flags)]


GEMM_ROWS = gemm_rows()
_TILE_WEIGHTS = 1 << 20  # weights dequantized at a time (4 MB fp32): every SmolLM2 matrix but the LM head
_exact_set = False


def kernels():
    """The compiled library when the block kernels run here, else None (see `why_unavailable`)."""
    global _exact_set
    if not door.active("ggml_blocks"):
        return None
    if not _exact_set:
        _exact_set = True
        if os.environ.get("ATTNLAB_GGUF_EXACT") == "1":
            door.call("ggml_exact", 1)
    return door.library()


@contextlib.contextmanager
def exact_products(on: bool = True):
    """Within the block, the batch-1 decode step (inference/block_step.py) multiplies in fp32 against the
    widened weights (the dequantized product to rounding) instead of its default integer path, which
    quantizes each activation row to int8 per block of 32 as llama.cpp does (~1.5x faster products on a CPU
    with AVX512-VNNI, ~2x with AVX2; see csrc/ggml_blocks.c), with its 4-bit matrices repacked 16 rows at
    a time (csrc/ggml_x16.c). Everything else (prompts, the LM head, BlockLinear called
    from Python) is exact either way. ATTNLAB_GGUF_EXACT=1 (or `generate --exact`) makes
    exact the default."""
    lib = kernels()
    old = door.call("ggml_exact", int(on)) if lib is not None else 1
    try:
        yield
    finally:
        if lib is not None:
            door.call("ggml_exact", old)


def available() -> bool:
    return kernels() is not None


def why_unavailable() -> str | None:
    return door.kernel_reason("ggml_blocks") or None


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
        if x.size(-1) != self.in_features:
            raise ValueError(f"BlockLinear: input has {x.size(-1)} features, expected {self.in_features}")
        if torch.is_grad_enabled() and x.requires_grad:
            raise RuntimeError("BlockLinear is inference-only (no gradients through quantized blocks)")
        if x.device != self.blocks.device:
            raise ValueError(f"BlockLinear: blocks are on {self.blocks.device}, the input on {x.device}")
        shape = x.shape
        x2 = x.reshape(-1, self.in_features)
        if x2.size(0) >= GEMM_ROWS or x.device.type != "cpu" or kernels() is None:
            out = self._gemm(x2)  # (and torch's ops wherever the block kernel cannot run)
            if self.bias is not None:
                out += self.bias.to(out.dtype)
            return out.view(*shape[:-1], self.out_features).to(x.dtype)
        if x2.dtype != torch.float32 or not x2.is_contiguous():
            x2 = x2.to(torch.float32).contiguous()
        m = x2.size(0)
        out = torch.empty(m, self.out_features, dtype=torch.float32)
        # output columns split over threads (csrc/thread_pool.c): a batch of rows is compute-bound and scales
        # with them; one row too (SmolLM2's 1536 x 576 Q4_1 matrix, one row, AVX2: 135 us on one thread, 72-91
        # on two), given 64 weight rows a thread at least
        door.call("ggml_matmul_cols", self.kind, x2, m, self.in_features, self.blocks, self.out_features, out,
                  min_rows=1 if m > 1 else 64)
        if self.bias is not None:
            out += self.bias
        out = out.view(*shape[:-1], self.out_features)
        return out if x.dtype == torch.float32 else out.to(x.dtype)

    def packed_x16(self) -> torch.Tensor | None:
        """The blocks repacked 16 rows at a time for the batch-1 step's integer products (csrc/ggml_x16.c: one
        64-byte load holds 4 weights of each of 16 rows), made on first use and kept (as many bytes as Q4_1
        blocks); None where that kernel does not run here or the matrix is not Q4_0 / Q4_1 with rows a
        multiple of 16."""
        if "_x16" not in self.__dict__:
            packed = None
            if (self.kind in (2, 3) and self.out_features % 16 == 0 and self.in_features <= 65536
                    and self.blocks.device.type == "cpu" and kernels() is not None and door.active("ggml_x16")):
                packed = torch.empty(self.out_features * self.in_features // 32 * 20, dtype=torch.uint8)
                try:
                    door.call("ggml_x16_pack", self.kind, self.blocks, self.out_features, self.in_features, packed,
                              torch.get_num_threads())
                except RuntimeError:  # a Q4_0 scale whose offset -8 d overflows fp16: the GGUF blocks serve
                    packed = None
            self.__dict__["_x16"] = packed
        return self.__dict__["_x16"]

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
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"dequantize_rows: dtype must be float32 or bfloat16, got {dtype}")
    _check_blocks(blocks, kind, blocks.size(0) if blocks.dim() == 2 else -1, cols, "dequantize_rows")
    flat = ids.reshape(-1).to(torch.int64).contiguous()
    if flat.device.type != "meta" and flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= blocks.size(0)):
        raise IndexError(f"token id out of range [0, {blocks.size(0)})")
    if blocks.device.type != "cpu" or flat.device.type != "cpu" or kernels() is None:
        return _dequantize_torch(blocks, kind, cols, flat.to(blocks.device), dtype).view(*ids.shape, cols)
    out = torch.empty(flat.numel(), cols, dtype=dtype)
    door.call("ggml_rows" if dtype == torch.float32 else "ggml_rows_bf16", kind, blocks, blocks.size(0), cols,
              flat, flat.numel(), out)
    return out.view(*ids.shape, cols)


def _dequantize_torch(blocks: torch.Tensor, kind: int, cols: int, ids: torch.Tensor,
                      dtype: torch.dtype) -> torch.Tensor:
    """The kernel's dequantization in torch's ops (see csrc/ggml_blocks.c for the layouts): (n, cols)."""
    size = BLOCK_TYPES[kind][1]
    raw = blocks.index_select(0, ids).view(ids.numel(), cols // 32, size)
    d = raw[..., :2].contiguous().view(torch.float16).float()  # (n, blocks, 1)
    if kind == 8:
        w = d * raw[..., 2:].contiguous().view(torch.int8).float()
    else:
        nib = raw[..., 4 if kind == 3 else 2:]
        codes = torch.cat((nib & 15, nib >> 4), dim=-1).float()  # byte j: weight j (low), weight j + 16 (high)
        m = raw[..., 2:4].contiguous().view(torch.float16).float() if kind == 3 else -8 * d
        w = torch.addcmul(m, d, codes)
    return w.reshape(ids.numel(), cols).to(dtype)


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
