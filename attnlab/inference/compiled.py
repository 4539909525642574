"""Compiled decoding: a static KV cache and one compiled graph for the one-token step (the gpt-fast
recipe), behind `generate(..., compile=True)`.

Why it is faster on a CPU: a decoding step is ~200 skinny matmuls (batch x hidden times hidden x out)
that must read every weight once. MKL's fp32 GEMV reaches about 8 GB/s here, less than half of what
the memory system gives a plain sum (~20 GB/s on 2 cores). Inductor with `freezing` treats the weights
as constants and, with `max_autotune`, packs them for its own C++ micro-GEMM, which streams them at
close to the memory bound; the rest of the step (norms, RoPE, attention, residuals) fuses around them.
Measured on SmolLM2-135M: 2.5x the eager tokens/s at batch 1 and 8, same greedy ids
(benchmarks/generate_vs_transformers.py --compile).

What it costs: the first step of a new batch size compiles for 1.5-2 minutes on one core; the result is
saved as an AOTInductor package (`aot.py`, ~2x the weights' size on disk), which a later process with the
same weights and batch size loads in a few seconds. Frozen weights are a snapshot: after changing the
model's weights, call `forget(model)` (the next step hashes the new weights and compiles for them).

The static cache: every layer's keys/values live in one (B, Hkv, capacity, d) buffer; step t writes
column t in place and attends over all columns with a mask that admits the filled ones. Shapes never
change from step to step, so the graph compiles once. Capacity is rounded up to a multiple of
`CAPACITY_STEP` so that nearby prompt lengths share a graph.
"""
from __future__ import annotations

import sys
import weakref

import torch
import torch._inductor.config as inductor_config

from ..nn import AttentionMask
from . import aot
from .kv_cache import KVCache

CAPACITY_STEP = 128


def capacity_bucket(tokens: int, limit: int) -> int:
    """Columns of a compiled step's key/value view for `tokens` tokens: rounded up to a multiple of
    CAPACITY_STEP (one graph per bucket), but never past `limit` nor below `tokens`."""
    return max(tokens, min(-(-tokens // CAPACITY_STEP) * CAPACITY_STEP, limit))


class _ColumnWriter:
    """The `KVCacheLike` the compiled step sees: writes this step's k/v at column `col` and hands back
    the whole static buffer (masked columns are zeros, so they contribute nothing)."""

    def __init__(self, keys, values, col: torch.Tensor) -> None:
        self.keys, self.values, self.col = keys, values, col

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor):
        self.keys[layer_idx].index_copy_(2, self.col, k)
        self.values[layer_idx].index_copy_(2, self.col, v)
        return self.keys[layer_idx], self.values[layer_idx]


class _PagedWriter:
    """The `KVCacheLike` of the compiled engine step: write each row's new k/v into its pool slot, then
    gather every row's W history slots (unused ones point at the scratch block and are masked)."""

    def __init__(self, keys, values, write, read) -> None:
        self.keys, self.values, self.write, self.read = keys, values, write, read

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor):
        s, h, _, d = k.shape  # one new token per row
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        keys.index_copy_(0, self.write, k.reshape(s, h, d))
        values.index_copy_(0, self.write, v.reshape(s, h, d))
        return (keys.index_select(0, self.read).view(s, -1, h, d).transpose(1, 2),
                values.index_select(0, self.read).view(s, -1, h, d).transpose(1, 2))


def check_compilable(model) -> None:
    """The static step covers causal decoders with learned, sinusoidal or rotary positions and full or
    sliding-window attention (in every layer); anything else gets a clear error instead of a wrong answer."""
    cfg = model.config
    backbone = getattr(model, "backbone", None)
    problems = []
    if backbone is None or not getattr(cfg, "causal", False) or not hasattr(model, "lm_head"):
        problems.append("it is not a causal LM (CausalLM)")
    else:
        if cfg.sliding_window and not all(backbone._is_local(i) for i in range(cfg.num_layers)):
            problems.append(f"sliding_window={cfg.sliding_window} in some layers only")
        if cfg.num_experts:  # the expert dispatch has data-dependent shapes
            problems.append(f"num_experts={cfg.num_experts} (a mixture of experts)")
        if backbone.relative_bias is not None:
            problems.append("relative position bias")
        if cfg.attention_kind != "softmax":
            problems.append(f"attention_kind={cfg.attention_kind}")
        if cfg.extra.get("position_offset") is not None:
            problems.append("position_offset")
    if problems:
        raise ValueError(f"compile=True supports causal decoders with full (or all-sliding-window) attention with a "
                         f"dense FFN; this model has "
                         f"{', '.join(problems)}; run it without compile")


def _step(model, token, position, allowed, col, keys, values):
    """token (B, 1), position (B, 1), allowed (B, 1, 1, C) bool, col (1,) -> logits (B, V)."""
    return _one_token(model, token, position, allowed, _ColumnWriter(keys, values, col))


def _paged_step(model, token, position, allowed, write, read, keys, values):
    """The engine's decode rows over the paged pool: token/position (S, 1), write (S,) slots, read (S * W,)
    slots, allowed (S, 1, 1, W) bool -> logits (S, V)."""
    return _one_token(model, token, position, allowed, _PagedWriter(keys, values, write, read))


def _one_token(model, token, position, allowed, cache):
    bb = model.backbone
    x = bb.embeddings(token, None, position, None)
    rope = bb.rope(position) if bb.rope is not None else None
    mask = AttentionMask(allowed, False)
    for i, layer in enumerate(bb.layers):
        x, _ = layer(x, mask, rope=rope, cache=cache, layer_idx=i)
    if bb.final_norm is not None:
        x = bb.final_norm(x)
    return model.lm_head(x[:, -1])


class _CompiledStep:
    """One model's compiled one-token step (`_fn`). `autotune=False` skips the GEMM autotuning (compiles in
    seconds, runs at about eager speed: for tests); `backend` is torch.compile's ("eager" traces without
    codegen)."""
    _fn = None  # the step function, set by each subclass

    _persistable = False  # the step's signature is the one aot.py exports (StaticDecoder's)

    def __init__(self, model, *, autotune: bool = True, backend: str = "inductor", persist: bool = True,
                 cache_dir=None) -> None:
        check_compilable(model)
        self._model = weakref.ref(model)  # the registry below must not keep the model alive
        self.window = model.config.sliding_window  # every layer local (check_compilable): caches may roll
        self.autotune, self.backend = autotune, backend
        self.persist = persist and backend == "inductor" and self._persistable
        self.cache_dir, self._runners = cache_dir, {}  # batch size -> AOTInductor runner
        self._weights = None  # aot.weights_digest, hashed once: the weights are a frozen snapshot (see forget)
        self._compiled = torch.compile(type(self)._fn, backend=backend, fullgraph=True)

    def _inductor_options(self) -> dict:
        # freezing: weights become constants, packed for inductor's C++ GEMM (the speed); no autotuning
        # tables on stderr
        return {"freezing": True, "max_autotune": self.autotune, "autotune_num_choices_displayed": 0,
                "max_autotune_report_choices_stats": False}

    def step(self, model, *args) -> torch.Tensor:
        if self.persist:
            # the package reads its inputs with the strides it was exported with (contiguous) and does not
            # check them: a strided view (e.g. ids[:, -1:]) would be read wrong, without an error
            *head, keys, values = args
            args = (*(t.contiguous() for t in head), keys, values)
            if not all(t.is_contiguous() for t in (*keys, *values)):
                raise ValueError("the compiled step writes keys/values into their buffers in place: "
                                 "they must be contiguous")
            batch = args[0].size(0)
            if batch not in self._runners:
                try:
                    self._weights = self._weights or aot.weights_digest(model)
                    self._runners[batch] = aot.load_or_build(type(self)._fn, model, args, self._inductor_options(),
                                                             directory=self.cache_dir, weights=self._weights)[0]
                except Exception as e:  # export can refuse what dynamo traces: compile in-process instead
                    print(f"note: the compiled step could not be packaged ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''}); compiling it in this process only",
                          file=sys.stderr)
                    self.persist = False
                    return self.step(model, *args)
            return self._runners[batch](*args)
        if self.backend != "inductor":
            return self._compiled(model, *args)
        # Inductor reads these when it compiles, which happens inside a call (the first one for each new
        # shape). Passed as torch.compile(options=...) freezing is not applied (torch 2.13), so patch here.
        with inductor_config.patch(**self._inductor_options()):
            return self._compiled(model, *args)

    @property
    def model(self):
        return self._model()


class StaticDecoder(_CompiledStep):
    """`generate(..., compile=True)`: a static (B, Hkv, capacity, d) cache per generate call. With the
    inductor backend the step is an AOTInductor package kept on disk (`aot.py`): compiled once per
    (weights, batch size), loaded in seconds by every later process; `persist=False` compiles in-process."""
    _fn = staticmethod(_step)
    _persistable = True

    def session(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, max_new_tokens: int):
        return _Session(self, input_ids, attention_mask, max_new_tokens)


class PagedDecoder(_CompiledStep):
    """The continuous-batching engine's decode step, compiled: batch rows rounded up to a bucket (idle rows
    are padding) and a gather width W rounded up to a multiple of CAPACITY_STEP, so a graph is compiled
    once per bucket instead of once per (batch, length) the scheduler happens to form.
    Each row writes its new key/value into its pool slot and attends over the W slots its block table names."""
    _fn = staticmethod(_paged_step)


class _Session:
    """One generate call: the first call runs the prompt (eager, into a preallocated cache), each later
    call feeds one token (B, 1) through the compiled step. Returns next-token logits (B, V) in fp32."""

    def __init__(self, decoder: StaticDecoder, input_ids, attention_mask, max_new_tokens: int) -> None:
        self.model = model = decoder.model
        b, p = input_ids.shape
        need = p + max_new_tokens
        # Sliding window W shorter than the generation: the static cache is a ring of W columns (Mistral's
        # rolling buffer, Jiang et al. 2023, §2): column c lives in slot c % W, so the token written at c
        # overwrites c - W, the first one out of the window; all slots hold keys within the window.
        self.ring = decoder.window if decoder.window is not None and need > decoder.window else None
        capacity = self.ring or capacity_bucket(need, model.config.max_position_embeddings)
        self.decoder, self.mask, self.prompt_len = decoder, attention_mask, p
        self.cache = KVCache.for_model(model) if self.ring else KVCache(model.config.num_layers, max_length=capacity)
        device = input_ids.device
        self.allowed = torch.zeros(b, 1, 1, capacity, dtype=torch.bool, device=device)
        if not self.ring:
            self.allowed[:, 0, 0, :p] = True if attention_mask is None else attention_mask.bool()
        real = attention_mask.long().sum(-1) if attention_mask is not None else torch.full((b,), p, device=device)
        self.next_position = real[:, None]  # left padding: a row's positions count its real tokens only
        self.col, self.started = p, False

    def __call__(self, step_input: torch.Tensor) -> torch.Tensor:
        if not self.started:
            self.started = True
            out = self.model(step_input, attention_mask=self.mask, past_key_values=self.cache, use_cache=True,
                             logits_to_keep=1)
            if self.ring:
                self._fill_ring()
            else:
                for k, v in zip(self.cache.keys, self.cache.values):  # unwritten columns must be 0, not garbage:
                    k[:, :, self.col:].zero_()                         # 0 x NaN would poison the masked sum
                    v[:, :, self.col:].zero_()
                self.keys, self.values = self.cache.keys, self.cache.values
            return out.logits[:, -1].float()
        slot = self.col % self.ring if self.ring else self.col
        col = torch.tensor([slot], device=step_input.device)
        self.allowed[:, :, :, slot] = True
        logits = self.decoder.step(self.model, step_input, self.next_position, self.allowed, col, self.keys,
                                   self.values)
        self.next_position = self.next_position + 1
        self.col += 1
        return logits.float()

    def _fill_ring(self) -> None:
        """Move the prompt's last W - 1 keys/values (what the rolling cache kept) into their ring slots."""
        p, w = self.prompt_len, self.ring
        kept = self.cache.keys[0].size(2)
        cols = torch.arange(p - kept, p, device=self.allowed.device)
        self.keys, self.values = [], []
        for k, v in zip(self.cache.keys, self.cache.values):
            ring_k, ring_v = k.new_zeros(*k.shape[:2], w, k.size(3)), v.new_zeros(*v.shape[:2], w, v.size(3))
            ring_k[:, :, cols % w], ring_v[:, :, cols % w] = k, v
            self.keys.append(ring_k)
            self.values.append(ring_v)
        self.allowed[:, 0, 0, cols % w] = True if self.mask is None else self.mask[:, p - kept:].bool()


_DECODERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def static_decoder(model) -> StaticDecoder:
    """The model's compiled decoder, made on first use and kept while the model lives (compiling is
    the expensive part; later calls with the same batch size and capacity reuse the graph)."""
    if model not in _DECODERS:
        _DECODERS[model] = StaticDecoder(model)
    return _DECODERS[model]


def forget(model) -> None:
    """Drop the model's compiled decoder (its weights are a frozen snapshot)."""
    _DECODERS.pop(model, None)
