"""Greedy decoding of a GGUF model on the C kernels, with numpy buffers and no torch import.

`import torch` alone takes ~2 s on a small CPU, longer than the rest of `attnlab generate smollm2 --prompt ...`
up to its first token. For a LLaMA-style .gguf whose every matrix is Q4_0, Q4_1 or Q8_0 blocks, the whole
decoder already runs in C (nn/csrc): the prompt through `paged_decode_layers` (every layer of all prompt rows
per call, each row attending to the rows before it: the serving engine's step, paged_step.c, with one
sequence's positions as its slots), then one token at a time through `llama_decode_step` (ggml_blocks.c, the
batch-1 step `generate` takes on the same model), the LM head through `ggml_matmul_cols_par`. Here numpy
holds the buffers and the file's blocks stay memory-mapped, so `generate` prints its first token without
loading torch. The numbers are those of the modules' path: the same C functions in the same order, with the
prompt's products and attention in C rather than torch's (rounding differences only;
tests/test_lean_decode.py holds the texts equal).

`LeanDecoder.open` says why not (and the command takes the torch path) for anything else: another
architecture or tensor type, no C compiler.
"""
from __future__ import annotations

import ctypes
import math
import os
from pathlib import Path
from typing import Iterator

import numpy as np

from ..gguf_file import GGML_TYPES, _reader
from ..gguf_meta import check_shapes_before_allocating, gguf_config, unpermute_rope
from ..nn import kernel_build

_BLOCK_KINDS = (2, 3, 8)  # the GGML types the C steps multiply with (Q4_0, Q4_1, Q8_0)
_MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")  # the C steps' order
_PROMPT_ROWS = 128  # prompt rows per prefill call: bounds the scratch (23 KB a row for SmolLM2)
_p, _i32, _i64, _f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float


def _ptr(a: np.ndarray) -> ctypes.c_void_p:
    return _p(a.ctypes.data)


_SYS_CPU = Path("/sys/devices/system/cpu")


def threads() -> int:
    """The C steps' thread count: OMP_NUM_THREADS if set, else the physical cores among the CPUs this process
    may run on (torch's default is the physical cores too; a core's second hyper-thread adds no memory
    bandwidth to a decoding step)."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    if value.isdigit() and int(value) > 0:
        return int(value)
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    cores = set()
    for cpu in cpus:
        topology = _SYS_CPU / f"cpu{cpu}" / "topology"
        try:
            cores.add(((topology / "physical_package_id").read_text().strip(),
                       (topology / "core_id").read_text().strip()))
        except OSError:  # no sysfs topology (not Linux, a container hiding it): count the CPUs
            return len(cpus)
    return max(1, len(cores))


def _pack_x16(w: np.ndarray, kind: int) -> np.ndarray | None:
    """Matrix `w` ((N, row bytes) of GGUF blocks) repacked by ggml_x16_pack, or None where it does not fit."""
    if kind not in (2, 3):  # Q4_0, Q4_1: what ggml_x16_pack takes
        return None
    bs = GGML_TYPES[kind][2]
    if w.ndim != 2 or w.shape[1] % bs or w.shape[0] % 16 or w.shape[1] // bs * 32 > 65536:
        return None
    n, k = w.shape[0], w.shape[1] // bs * 32
    out = np.empty(n * k // 32 * 20, np.uint8)
    w = np.ascontiguousarray(w)
    try:
        kernel_build.call_bound("ggml_x16_pack", _i32(kind), _ptr(w), _i64(n), _i64(k), _ptr(out), _i32(threads()))
    except RuntimeError:  # a Q4_0 offset -8 d beyond fp16: the GGUF blocks serve
        return None
    return out


class LeanDecoder:
    """A GGUF decoder on the C kernels. `open(path)` -> (decoder, "") or (None, why it cannot run here)."""

    @classmethod
    def open(cls, path: str | Path) -> tuple[LeanDecoder | None, str]:
        path = Path(path)
        if path.suffix.lower() != ".gguf" or not path.is_file():
            return None, f"{path} is not a .gguf file"
        lib = kernel_build.load()
        if lib is None:
            return None, f"the C kernels are unavailable ({kernel_build.why_unavailable()})"
        cfg = gguf_config(path)  # ConfigError / CheckpointError for a file that lies: the user's error either way
        reader = _reader(str(path.resolve()))
        check_shapes_before_allocating(reader, cfg, str(path))
        if cfg.dim_head % 2 or cfg.rotary_dim != cfg.dim_head or cfg.num_heads % cfg.kv_heads:
            return None, "a rotary or head layout the C steps do not take"
        infos = {name: (dims, kind, offset) for name, dims, kind, offset in reader.tensors}
        norms = [f"blk.{i}.{n}.weight" for i in range(cfg.num_layers) for n in ("attn_norm", "ffn_norm")]
        blocks = [f"blk.{i}.{n}.weight" for i in range(cfg.num_layers) for n in _MATRICES]
        blocks += ["token_embd.weight"] + (["output.weight"] if "output.weight" in infos else [])
        if any(infos[n][1] not in _BLOCK_KINDS for n in blocks):
            return None, "a matrix that is not Q4_0, Q4_1 or Q8_0 blocks"
        if any(infos[n][1] != 0 for n in [*norms, "output_norm.weight"]):
            return None, "a norm weight that is not F32"
        return cls(path, lib, cfg, reader, infos), ""

    def __init__(self, path: Path, lib, cfg, reader, infos: dict) -> None:
        self.path, self.lib, self.cfg = path, lib, cfg
        mapped = np.memmap(str(path), dtype=np.uint8, mode="r")  # the blocks stay in the file's pages

        def tensor(name: str) -> np.ndarray:
            dims, kind, offset = infos[name]
            raw = reader.tensor_bytes(name, dims, kind, offset)  # bounds-checked against the file
            start = raw.ctypes.data - reader.buf.ctypes.data
            view = mapped[start:start + raw.size].reshape(raw.shape)
            return view.view(np.float32).reshape(-1) if kind == 0 else view

        self.keep: list[np.ndarray] = []  # every array C holds a pointer to
        self.kinds = (_i32 * (7 * cfg.num_layers))()
        self._weights: list[list[np.ndarray]] = []
        for i in range(cfg.num_layers):
            row = [tensor(f"blk.{i}.attn_norm.weight"), tensor(f"blk.{i}.ffn_norm.weight")]
            for j, n in enumerate(_MATRICES):
                w = tensor(f"blk.{i}.{n}.weight")
                heads = {"attn_q": cfg.num_heads, "attn_k": cfg.kv_heads}.get(n)
                if heads is not None:  # llama.cpp's Q/K row order -> "rotate half" (as interop/gguf.py loads it)
                    w = np.ascontiguousarray(unpermute_rope(w, heads))
                row.append(w)
                self.kinds[7 * i + j] = infos[f"blk.{i}.{n}.weight"][1]
            self._weights.append(row)
        # each 4-bit matrix repacked 16 rows at a time for the steps' integer products (csrc/ggml_x16.c)
        x16 = bool(lib.ggml_x16_supported())
        self._packed = [_pack_x16(w, self.kinds[7 * i + j]) if x16 else None
                        for i, row in enumerate(self._weights) for j, w in enumerate(row[2:])]
        self.packed = (_p * len(self._packed))(*[None if a is None else a.ctypes.data for a in self._packed])
        self.embed, self.embed_kind = tensor("token_embd.weight"), infos["token_embd.weight"][1]
        head = "output.weight" if "output.weight" in infos else "token_embd.weight"  # tied when absent
        self.head, self.head_kind = tensor(head), infos[head][1]
        self.final_norm = tensor("output_norm.weight")
        self.scale = cfg.attention_scale if cfg.attention_scale is not None else 1.0 / math.sqrt(cfg.dim_head)
        self.eos = {int(cfg.eos_token_id)} if cfg.eos_token_id is not None else set()
        exact = os.environ.get("ATTNLAB_GGUF_EXACT") == "1"
        if exact:
            self.exact(True)

    def exact(self, on: bool) -> bool:
        """Batch-1 steps in fp32 against the widened blocks instead of int8 activations (`generate --exact`);
        one switch for the process's library, as `nn.quantized.exact_products`. Returns the old setting."""
        return bool(self.lib.ggml_exact(_i32(int(on))))  # a flag only: nothing to check

    # ------------------------------------------------------------------------------------------- the steps
    def _table(self, keys: list[np.ndarray], values: list[np.ndarray]):
        ptrs = []
        for row, k, v in zip(self._weights, keys, values):
            ptrs += [a.ctypes.data for a in row] + [k.ctypes.data, v.ctypes.data]
        return (_p * len(ptrs))(*ptrs)

    def _rope(self, capacity: int) -> tuple[np.ndarray, np.ndarray]:
        """cos and sin (capacity, head_dim), as RotaryEmbedding computes them (fp32)."""
        dim = self.cfg.rotary_dim
        inv_freq = np.float32(1.0) / (np.float32(self.cfg.rope_theta) ** (np.arange(0, dim, 2, dtype=np.float32)
                                                                             / np.float32(dim)))
        angles = np.arange(capacity, dtype=np.float32)[:, None] * inv_freq
        emb = np.concatenate((angles, angles), axis=-1)
        return np.ascontiguousarray(np.cos(emb), np.float32), np.ascontiguousarray(np.sin(emb), np.float32)

    def _embed(self, ids: np.ndarray) -> np.ndarray:
        if ids.size and (ids.min() < 0 or ids.max() >= self.cfg.vocab_size):
            raise ValueError(f"token id {int(ids.max() if ids.max() >= self.cfg.vocab_size else ids.min())} is "
                             f"outside the vocabulary of {self.cfg.vocab_size}")
        out = np.empty((ids.size, self.cfg.hidden_size), np.float32)
        kernel_build.call_bound("ggml_rows", _i32(self.embed_kind), _ptr(self.embed), _i64(self.cfg.vocab_size),
                                _i64(self.cfg.hidden_size), _ptr(ids), _i64(ids.size), _ptr(out))
        return out

    def _logits(self, x: np.ndarray) -> np.ndarray:
        """The LM head on the final RMSNorm of one hidden row."""
        x = x.astype(np.float32)
        n = x * (np.float32(1.0) / np.sqrt(np.mean(x * x, dtype=np.float32) + np.float32(self.cfg.norm_eps)))
        n = np.ascontiguousarray(n * self.final_norm, np.float32)
        out = np.empty(self.cfg.vocab_size, np.float32)
        v, k = self.cfg.vocab_size, self.cfg.hidden_size
        kernel_build.call_bound("ggml_matmul_cols_par", _i32(self.head_kind), _ptr(n), _i64(1), _i64(k),
                                _ptr(self.head), _i64(v), _ptr(out), _i64(0), _i64(v),
                                _i32(max(1, min(self._threads, v // 64))))
        return out

    def start(self, ids: list[int], max_new_tokens: int) -> np.ndarray:
        """Run prompt `ids` (room for `max_new_tokens` more after it): the next-token logits (vocab,)."""
        cfg, n = self.cfg, len(ids)
        if n < 1:
            raise ValueError("generation needs a prompt of at least one token")
        capacity = n + max(1, max_new_tokens)
        if capacity > cfg.max_position_embeddings:
            raise ValueError(f"prompt of {n} tokens + max_new_tokens={max_new_tokens} exceeds the model's context "
                             f"of {cfg.max_position_embeddings} tokens")
        self._threads = threads()  # (read once a run: an environment look-up and a system call)
        cos, sin = self._rope(capacity)
        kvn = cfg.kv_heads * cfg.dim_head
        # the prompt: rows of one sequence, its positions as the pool's slots (row b attends to slots 0..b)
        pool_k = [np.empty((n, kvn), np.float32) for _ in range(cfg.num_layers)]
        pool_v = [np.empty((n, kvn), np.float32) for _ in range(cfg.num_layers)]
        table = self._table(pool_k, pool_v)
        per_row = kernel_build.step_scratch_floats(cfg)
        x = self._embed(np.asarray(ids, np.int64))
        for first in range(0, n, _PROMPT_ROWS):
            rows = np.arange(first, min(n, first + _PROMPT_ROWS), dtype=np.int64)
            part = np.ascontiguousarray(x[rows])
            slots = np.concatenate([np.arange(p + 1, dtype=np.int64) for p in rows])
            offsets = np.concatenate(([0], np.cumsum(rows + 1))).astype(np.int64)
            scratch = np.empty(rows.size * per_row, np.float32)
            kernel_build.call_bound(
                "paged_decode_layers", cfg.num_layers, rows.size, _ptr(part), table, self.kinds, cfg.hidden_size,
                cfg.num_heads, cfg.kv_heads, cfg.dim_head, cfg.intermediate_size, cfg.norm_eps, self.scale, n,
                capacity, _ptr(rows), _ptr(cos), _ptr(sin), _ptr(rows), _ptr(slots), _ptr(offsets), slots.size, 0,
                _ptr(scratch), self._threads)
            x[rows] = part
        # then one token a step: the batch-1 step's cache layout (kv_heads, capacity, head_dim) per layer
        keys = [np.empty((cfg.kv_heads, capacity, cfg.dim_head), np.float32) for _ in range(cfg.num_layers)]
        values = [np.empty((cfg.kv_heads, capacity, cfg.dim_head), np.float32) for _ in range(cfg.num_layers)]
        for pk, pv, k, v in zip(pool_k, pool_v, keys, values):
            k[:, :n] = pk.reshape(n, cfg.kv_heads, cfg.dim_head).transpose(1, 0, 2)
            v[:, :n] = pv.reshape(n, cfg.kv_heads, cfg.dim_head).transpose(1, 0, 2)
        scratch = np.empty(kernel_build.step_scratch_floats(cfg, scores=capacity), np.float32)
        self._run = {"keys": keys, "values": values, "table": self._table(keys, values), "scratch": scratch,
                     "cos": cos, "sin": sin, "capacity": capacity, "pos": n}
        return self._logits(x[-1])

    def step(self, token: int) -> np.ndarray:
        """Feed one token after `start` (or the previous step): the next-token logits (vocab,)."""
        cfg, run = self.cfg, getattr(self, "_run", None)
        if run is None:
            raise RuntimeError("LeanDecoder.step before start: run the prompt first")
        pos = run["pos"]
        if pos >= run["capacity"]:
            raise ValueError(f"position {pos} is past the {run['capacity']} this run was started with")
        h = self._embed(np.asarray([token], np.int64))[0]
        kernel_build.call_bound(
            "llama_decode_step", cfg.num_layers, _ptr(h), run["table"], self.kinds, cfg.hidden_size, cfg.num_heads,
            cfg.kv_heads, cfg.dim_head, cfg.intermediate_size, cfg.norm_eps, self.scale, run["capacity"], pos,
            _ptr(run["cos"][pos]), _ptr(run["sin"][pos]), _ptr(run["scratch"]), self._threads, self.packed)
        run["pos"] = pos + 1
        return self._logits(h)

    def greedy(self, ids: list[int], max_new_tokens: int) -> Iterator[int]:
        """The greedy continuation of prompt `ids`, one token id at a time (EOS included: the caller stops)."""
        if max_new_tokens < 1:
            return
        logits = self.start(ids, max_new_tokens)
        for i in range(max_new_tokens):
            token = int(np.argmax(logits))
            yield token
            if i + 1 < max_new_tokens:
                logits = self.step(token)
