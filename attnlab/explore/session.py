"""The explorer's model side: one loaded model, its tokenizer, and the computations the page asks for.

A POST /api/run computes everything once, through `viz.attention.extract` (the model's own weights from
`output_attentions`, and Q/K/V caught by hooks, RoPE and GQA applied as attention applies them), and keeps
the tensors under a run id; /api/attention and /api/head only slice them. A long input would make those
tensors large (layers x heads x n^2 weights), so past a budget a run keeps its thumbnails only and a
layer's numbers are computed when the page first asks for that layer.

Every float leaves rounded to 6 significant digits (`rounded`); every error is an `ExploreError` whose
status and message the app sends as {"error": "..."}.
"""
from __future__ import annotations

import base64
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..viz.attention import AttentionData, extract

MAX_RUNS = 8                 # runs kept (least recently used dropped first)
WEIGHT_BUDGET = 8_000_000    # attention weights (layers x heads x n^2) a run keeps; beyond: per layer on demand
NEURON_BUDGET = 3_000_000    # queries + keys + values a run keeps for every layer; beyond: per layer on demand
THUMB = 24                   # thumbnails are at most THUMB x THUMB


class ExploreError(Exception):
    """A request the explorer cannot answer: HTTP `status` and a message naming the field."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def rounded(x: Any) -> Any:
    """A tensor/array/number as plain lists of floats rounded to 6 significant digits (what JSON carries).
    Non-finite values become None (JSON has no infinity)."""
    a = np.asarray(x.detach().double().cpu().numpy() if torch.is_tensor(x) else x, dtype=np.float64)
    out = np.zeros_like(a)
    keep = np.isfinite(a) & (np.abs(a) >= 1e-30)  # below that: 0 (denormal float32 weights)
    v = a[keep]
    digits = 5 - np.floor(np.log10(np.abs(v)))
    r = np.empty_like(v)
    # dividing by an exact power of ten gives the double nearest the 6-digit decimal (repr prints it short)
    up = (digits >= 0) & (digits <= 22)
    r[up] = np.round(v[up] * 10.0 ** digits[up]) / 10.0 ** digits[up]
    down = digits < 0
    r[down] = np.round(v[down] / 10.0 ** -digits[down]) * 10.0 ** -digits[down]
    tiny = digits > 22
    r[tiny] = [float(f"{t:.6g}") for t in v[tiny]]
    out[keep] = r
    if np.isfinite(a).all():
        return out.tolist() if out.ndim else float(out)
    obj = out.astype(object)
    obj[~np.isfinite(a)] = None
    return obj.tolist() if obj.ndim else None


def model_kind(model) -> str:
    if isinstance(getattr(model, "encoder", None), torch.nn.Module) and \
            isinstance(getattr(model, "decoder", None), torch.nn.Module):
        return "encoder-decoder"
    if getattr(model.config, "causal", False) and hasattr(model, "lm_head"):
        return "decoder"
    return "encoder"


@dataclass
class Run:
    id: str
    ids: torch.Tensor                      # (1, n) the input ids of the stack shown by default
    token_types: torch.Tensor | None
    pieces: list[str]
    weights: list[torch.Tensor] | None     # per layer (H, n, n); None: over WEIGHT_BUDGET
    data: AttentionData | None             # scale, bias, allowed, and Q/K/V of the layers it holds
    stacks: dict[str, list[torch.Tensor]] = field(default_factory=dict)  # translate: encoder/decoder/cross
    layers: OrderedDict = field(default_factory=OrderedDict)  # layer -> AttentionData computed on demand
    model: Any = None                      # what `extract` runs on (a seq2seq model's encoder)
    global_tokens: list[int] | None = None  # Longformer: positions with global attention


class Explorer:
    """The model, the tokenizer, the kept runs and decoding sessions. Thread safe: one lock around every
    computation (the app answers from a thread pool)."""

    def __init__(self, model, tokenizer, *, name: str = "model", max_tokens: int = 512,
                 pooling: str | None = None, quantized: str | None = None) -> None:
        self.model, self.tokenizer, self.name = model.eval(), tokenizer, name
        self.kind = model_kind(model)
        self.config = model.config
        if int(max_tokens) < 1:
            raise ValueError(f"max_tokens must be positive, got {max_tokens}")
        self.pooling = pooling
        self.quantized = quantized if quantized is not None else _quantization(model)
        # what /api/run and /api/head look inside: the backbone; an encoder-decoder's encoder
        self.stack = model.encoder if self.kind == "encoder-decoder" else model
        # the input cap: the option, and never past the positions the model has
        self.max_tokens = min(int(max_tokens), self.stack.config.max_position_embeddings or int(max_tokens))
        self.lock = threading.RLock()
        self.runs: OrderedDict[str, Run] = OrderedDict()
        self.sessions: OrderedDict = OrderedDict()  # decoding.py's sessions
        self.info: dict | None = None                # GET /api/model's answer (info.py), built once

    @classmethod
    def load(cls, name: str, *, dtype: str = "fp32", max_tokens: int = 512) -> "Explorer":
        """Anything `attnlab info` takes: a directory, a .gguf (kept quantized where the kernels build), a
        packaged name. dtype bf16/int8 quantizes the linear layers as `attnlab serve --dtype` does."""
        from ..interop.api import keeps_quantized, load, load_tokenizer
        from ..interop.local import sentence_pooling
        keep = keeps_quantized(name)
        if keep and dtype != "fp32":
            raise ValueError(f"--dtype {dtype}: {name} is a .gguf kept quantized; use --dtype fp32")
        model = load(name, quantized=keep)
        tokenizer = load_tokenizer(name)
        if dtype != "fp32":
            from ..inference.quantize import quantize
            model = quantize(model, dtype, inplace=True)
        try:
            pooling = sentence_pooling(name)
        except Exception:  # a model whose modules.json we cannot read: plain mean pooling
            pooling = None
        return cls(model, tokenizer, name=str(name), max_tokens=max_tokens, pooling=pooling,
                   quantized=None if keep or dtype == "fp32" else dtype)

    # ------------------------------------------------------------------ tokens
    def piece(self, token_id: int) -> str:
        return self.tokenizer.decode([int(token_id)], skip_special_tokens=False)

    def token_list(self, ids, segments=None) -> list[dict]:
        special = self.tokenizer.special_ids
        segs = segments if segments is not None else [0] * len(ids)
        return [{"id": int(i), "piece": self.piece(i), "special": int(i) in special, "segment": int(s)}
                for i, s in zip(ids, segs)]

    def check_length(self, n: int, field_name: str = "text") -> None:
        if n > self.max_tokens:
            raise ExploreError(413, f"{field_name}: {n} tokens exceed the limit of {self.max_tokens} "
                                    f"(--max-tokens)")
        if n == 0:
            raise ExploreError(400, f"{field_name}: encodes to no tokens")

    def encode(self, text: str, text_b: str | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(1, n) ids and (1, n) segments or None. A decoder reads the text as `generate` does (no special
        tokens added); an encoder as it was trained ([CLS] A [SEP] B [SEP])."""
        if not isinstance(text, str) or not text.strip():
            raise ExploreError(400, "text: empty; give the text to look inside")
        if self.kind == "decoder":
            if text_b:
                raise ExploreError(400, "text_b: a decoder reads one text")
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            return torch.tensor([ids], dtype=torch.long), None
        # no truncation: a text over the limit is refused (413) rather than silently cut
        enc = self.tokenizer(text, text_b or None, truncation=False, return_tensors="pt")
        types = enc.get("token_type_ids") if text_b else None
        return enc["input_ids"], types

    # ------------------------------------------------------------------ runs
    def run(self, text: str, text_b: str | None = None, view: tuple[int, int, int] | None = None,
            global_tokens: list[int] | None = None) -> dict:
        """Tokens, thumbnails of every head, and with `view` = (layer, head, token) that head's map and
        equation too (the token clamped to the text's last), so an edit redraws every view from one answer.
        A Longformer gives global attention to `global_tokens` (default: the first token, [CLS] / <s>, as
        its classification setting does; Beltagy et al. 2020, §3.1)."""
        ids, types = self.encode(text, text_b)
        n = ids.size(1)
        self.check_length(n)
        glob = self.check_global(global_tokens, n)
        cfg = self.stack.config
        layers, heads, dh = cfg.num_layers, cfg.num_heads, cfg.dim_head
        keep_weights = layers * heads * n * n <= WEIGHT_BUDGET
        neuron = list(range(layers)) if keep_weights and 3 * layers * heads * n * dh <= NEURON_BUDGET else []
        pieces = [self.piece(i) for i in ids[0].tolist()]
        with self.lock:
            start = time.perf_counter()
            data = extract(self.stack, ids, pieces, token_type_ids=types, neuron=neuron, global_tokens=glob)
            thumbs = thumbnails(data.layers)
            ms = (time.perf_counter() - start) * 1e3
            run = Run(uuid.uuid4().hex[:12], ids, types, pieces, data.layers if keep_weights else None, data,
                      model=self.stack, global_tokens=glob)
            data.layers = data.layers if keep_weights else []
            self._keep(run)
        out = {"run": run.id, "tokens": self.token_list(ids[0].tolist(), types[0].tolist() if types is not None
                                                        else None),
               "num_layers": layers, "num_heads": heads, "thumbnails": thumbs, "mask_kind": self.attention_kind(),
               "global_tokens": glob, "ms": round(ms, 3)}
        if view is not None:
            layer, head, token = view
            out["view"] = {"attention": self.attention(run.id, layer, head),
                           "head": self.head(run.id, layer, head, min(token, n - 1))}
        return out

    def check_global(self, tokens: list[int] | None, n: int) -> list[int] | None:
        """The Longformer global positions of a run: [0] by default; None for every other model."""
        if not self.stack.config.global_attention:
            if tokens:
                raise ExploreError(400, "global_tokens: only a Longformer (global_attention) has global tokens")
            return None
        tokens = [0] if tokens is None else sorted(set(tokens))
        for i in tokens:
            self._check_index(i, n, "global_tokens")
        return tokens

    def _keep(self, run: Run) -> None:
        self.runs[run.id] = run
        while len(self.runs) > MAX_RUNS:
            self.runs.popitem(last=False)

    def get_run(self, run_id: str) -> Run:
        with self.lock:
            run = self.runs.get(run_id)
            if run is None:
                raise ExploreError(404, f"run: no run {run_id!r} (runs are kept for the last {MAX_RUNS} texts; "
                                        f"POST /api/run again)")
            self.runs.move_to_end(run_id)
            return run

    def _check_index(self, value: int, limit: int, field_name: str) -> int:
        if not isinstance(value, int) or not 0 <= value < limit:
            raise ExploreError(422, f"{field_name}: {value} is out of range 0..{limit - 1}")
        return value

    def layer_data(self, run: Run, layer: int) -> tuple[torch.Tensor, AttentionData]:
        """(weights (H, n, n), the AttentionData holding that layer's Q/K/V, bias and mask), computed on
        first use when the run did not keep them."""
        if run.weights is not None and layer in run.data.queries:
            return run.weights[layer], run.data
        with self.lock:
            if layer not in run.layers:
                data = extract(run.model, run.ids, run.pieces, token_type_ids=run.token_types, neuron=[layer],
                               global_tokens=run.global_tokens)
                data.layers = [data.layers[layer]]  # only this layer's weights stay
                run.layers[layer] = data
                while len(run.layers) > 2:
                    run.layers.popitem(last=False)
            run.layers.move_to_end(layer)
            data = run.layers[layer]
        return data.layers[0], data

    def attention(self, run_id: str, layer: int, head: int, stack: str | None = None) -> dict:
        run = self.get_run(run_id)
        if run.stacks:
            return self._stack_attention(run, layer, head, stack or "decoder")
        if stack not in (None, "encoder", "decoder", "self"):
            raise ExploreError(422, f"stack: {stack!r} is not one of encoder, decoder")
        cfg = run.model.config
        self._check_index(layer, cfg.num_layers, "layer")
        self._check_index(head, cfg.num_heads, "head")
        if run.weights is not None:
            weights, data = run.weights[layer], run.data
        else:
            weights, data = self.layer_data(run, layer)
        n = weights.size(-1)
        allowed = self.allowed(data, layer, n)
        return {"layer": layer, "head": head, "n": n, "weights": rounded(weights[head].reshape(-1)),
                "allowed": allowed.int().reshape(-1).tolist() if allowed is not None else None,
                "scale": rounded(self.scale(data)), "mask_note": self.mask_note(layer, n, run.global_tokens)}

    def _stack_attention(self, run: Run, layer: int, head: int, stack: str) -> dict:
        if stack not in ("encoder", "decoder"):
            raise ExploreError(422, f"stack: {stack!r} is not one of encoder, decoder")
        layers = run.stacks[stack]
        self._check_index(layer, len(layers), "layer")
        self._check_index(head, layers[0].size(0), "head")
        w = layers[layer][head]
        n = w.size(-1)
        allowed = torch.ones(n, n, dtype=torch.bool).tril() if stack == "decoder" else None
        cfg = (self.model.decoder if stack == "decoder" else self.model.encoder).config
        scale = cfg.attention_scale if cfg.attention_scale is not None else cfg.dim_head ** -0.5
        return {"layer": layer, "head": head, "n": n, "weights": rounded(w.reshape(-1)),
                "allowed": allowed.int().reshape(-1).tolist() if allowed is not None else None,
                "scale": rounded(scale), "mask_note": "causal: token i sees j <= i" if stack == "decoder"
                else "full: every token sees every token", "stack": stack}

    def cross(self, run_id: str, layer: int, head: int) -> dict:
        run = self.get_run(run_id)
        if "cross" not in run.stacks:
            raise ExploreError(404, "run: this run has no cross-attention (POST /api/translate makes one)")
        layers = run.stacks["cross"]
        self._check_index(layer, len(layers), "layer")
        self._check_index(head, layers[0].size(0), "head")
        w = layers[layer][head]
        return {"layer": layer, "head": head, "weights": rounded(w.reshape(-1)), "t": w.size(0), "s": w.size(1)}

    def head(self, run_id: str, layer: int, head: int, token: int) -> dict:
        """The notes' equation for query `token` of one head: q, every k and v, q.k, the scaled scores
        (+ bias), the mask row, the softmax (the model's own weights) and the weighted sum of values."""
        run = self.get_run(run_id)
        if run.stacks:
            raise ExploreError(400, "run: the step-by-step head view is for /api/run runs (the source's "
                                    "self-attention); a translate run shows weights only")
        cfg = run.model.config
        self._check_index(layer, cfg.num_layers, "layer")
        self._check_index(head, cfg.num_heads, "head")
        self._check_index(token, run.ids.size(1), "token")
        weights, data = self.layer_data(run, layer)
        q, k, v = data.queries[layer][head], data.keys[layer][head], data.values[layer][head]
        scale = self.scale(data)
        raw = k @ q[token]
        bias = data.bias[layer][head, token] if layer in data.bias else None
        counts = self.block_counts(k.size(0))
        if counts is not None:
            bias = counts[token].float().clamp(min=1).log()
        scaled = raw * scale + (bias if bias is not None else 0.0)
        n = k.size(0)
        allowed = self.allowed(data, layer, n)
        row = allowed[token] if allowed is not None else torch.ones(n, dtype=torch.bool)
        w = weights[head, token]
        return {"token": token, "d_k": q.size(-1), "scale": rounded(scale), "q": rounded(q[token]),
                "k": rounded(k), "v": rounded(v), "raw": rounded(raw), "scaled": rounded(scaled),
                "bias": rounded(bias) if bias is not None else None, "allowed": row.int().tolist(),
                "weights": rounded(w), "output": rounded(w @ v)}

    # ------------------------------------------------------------------ masks
    @staticmethod
    def scale(data: AttentionData) -> float:
        return float(data.scale) if data.scale is not None else 1.0

    def allowed(self, data: AttentionData, layer: int, n: int) -> torch.Tensor | None:
        """(n, n) bool: which keys each query may see; None: every one."""
        if layer in data.allowed:
            return data.allowed[layer].bool()
        counts = self.block_counts(n)
        return counts > 0 if counts is not None else None

    def block_counts(self, n: int) -> torch.Tensor | None:
        """BigBird (eval mode): how often each key enters each query's softmax, (n, n); None when the input
        is short enough for full attention or the model is not block-sparse. Block 0 fills the r random
        slots of a middle row, so it counts 1 + r times: a bias of log(count) on its scores."""
        cfg = self.stack.config
        if cfg.attention_kind != "block_sparse":
            return None
        from ..nn.block_sparse import token_counts, uses_blocks
        block = cfg.sparse_block_size
        if not uses_blocks(n, block, cfg.num_random_blocks):
            return None
        padded = -(-n // block) * block
        return token_counts(padded, block, cfg.num_random_blocks, None)[0, :n, :n]

    def attention_kind(self) -> str:
        cfg = self.stack.config
        if cfg.attention_kind == "block_sparse":
            return "bigbird"
        if cfg.global_attention:
            return "longformer"
        if cfg.sliding_window:
            return "mixed" if cfg.extra.get("global_every") else "sliding"
        return "causal" if cfg.causal else "full"

    def mask_note(self, layer: int, n: int, global_tokens: list[int] | None = None) -> str:
        cfg = self.stack.config
        kind = self.attention_kind()
        if kind == "bigbird":
            return f"BigBird blocks of {cfg.sparse_block_size}: first/last block global, 3-block band " \
                   f"(no random blocks at inference)"
        if kind == "longformer":
            w = cfg.sliding_window
            where = ", ".join(map(str, global_tokens or [])) or "none"
            return (f"longformer: window |i - j| < {w}, and global tokens ({where}) see and are seen by every "
                    f"token; a global token's output comes from its own global Q/K/V (the map shows the "
                    f"window pass the model returns)")
        backbone = getattr(self.stack, "backbone", self.stack)
        local = bool(cfg.sliding_window) and bool(getattr(backbone, "_is_local", lambda i: False)(layer))
        if local:
            w = cfg.sliding_window
            return f"sliding window {w}: token i sees j with " + ("i - {0} < j <= i".format(w) if cfg.causal
                                                                  else "|i - j| < {0}".format(w))
        return "causal: token i sees j <= i" if cfg.causal else "full: every token sees every token"


def thumbnails(layers: list[torch.Tensor]) -> dict:
    """Every layer x head map average-pooled to size x size (size = min(n, THUMB)), row-major, as one byte
    per cell: each map scaled to its own peak (255 = peak), base64. A thumbnail is a picture drawn on
    256 shades; as floats in JSON the 6 x 12 maps of MiniLM were 0.5 MB and 15 ms of encoding per edit.
    value = byte / 255 x peak[layer][head]."""
    w = torch.stack([x.float() for x in layers])  # (L, H, n, n)
    n = w.size(-1)
    size = min(n, THUMB)
    pooled = F.adaptive_avg_pool2d(w.flatten(0, 1)[:, None], size)[:, 0] if size < n else w.flatten(0, 1)
    pooled = pooled.reshape(w.size(0), w.size(1), size * size)
    peak = pooled.amax(-1).clamp(min=1e-30)
    cells = (pooled / peak[..., None] * 255).round().clamp(0, 255).to(torch.uint8)
    return {"size": size, "encoding": "uint8-base64", "peak": rounded(peak),
            "data": base64.b64encode(cells.numpy().tobytes()).decode("ascii")}


def _quantization(model) -> str | None:
    """"Q4_1 (kept quantized)" for a GGUF model on its blocks, else None."""
    from ..nn.quantized import BLOCK_TYPES, BlockLinear
    for m in model.modules():
        if isinstance(m, BlockLinear):
            return f"{BLOCK_TYPES[m.kind][0]} (kept quantized)"
    return None
