"""What the attention pages show, taken from a model: tokens, the attention weights of every layer and
head, and (for the neuron view) the queries and keys those weights were computed from.

The weights come from the model's explicit path, `model(..., output_attentions=True).attentions`, so the
page shows exactly what the model computed. Queries and keys are caught with forward hooks on each
layer's `attn.q` / `attn.k` projections and then put through the same steps attention takes (split into
heads, RoPE, GQA sharing), so that in the neuron view

    softmax(q · k / sqrt(d_k) + bias) == the model's weights

`AttentionData` is the generic input of the page: any model that can give tokens and per-layer weights
(an encoder, a decoder with `causal=True`, the cross-attention of an encoder-decoder) plugs in by
building one directly.

    >>> data = AttentionData(tokens=["[CLS]", "hi", "[SEP]"], layers=[torch.full((1, 3, 3), 1 / 3)])
    >>> data.num_layers, data.num_heads
    (1, 1)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from ..nn.attention import AttentionMask
from ..nn.positions import apply_rotary
from ..nn.relative_xl import XLPositions, stream_masks

# Above this many numbers (queries + keys) the page keeps them for one layer only: a bert-base page of
# 128 tokens would otherwise weigh tens of megabytes.
NEURON_BUDGET = 600_000


@dataclass
class AttentionData:
    """Everything a page draws. Tensors are CPU float; H heads, T query tokens, S key tokens.

    tokens         the sequence whose attention is shown (queries; also keys of self-attention)
    layers         per layer, self-attention weights (H, T, T); rows sum to 1
    causal         a decoder: token i sees only j <= i (the upper triangle is zero)
    segments       per token 0 (sentence A) or 1 (sentence B), for BERT pairs
    cross          per layer, cross-attention weights (H, T, S) of an encoder-decoder
    source_tokens  the S tokens cross-attention reads (the encoder's input)
    queries, keys  {layer: (H, T, d_k)}: after RoPE, keys repeated per query head under GQA
    values         {layer: (H, T, d_k)}: the values the weights average (repeated under GQA like the keys)
    scale          the factor on q·k (1/sqrt(d_k) unless the config says otherwise)
    bias           {layer: (H, T, T)} added to the scores before the softmax (T5's relative bias)
    allowed        {layer: (T, T) bool}: which keys each query may see (causal / sliding window)
    """
    tokens: list[str]
    layers: list[torch.Tensor]
    causal: bool = False
    segments: list[int] | None = None
    cross: list[torch.Tensor] | None = None
    source_tokens: list[str] | None = None
    queries: dict[int, torch.Tensor] = field(default_factory=dict)
    keys: dict[int, torch.Tensor] = field(default_factory=dict)
    values: dict[int, torch.Tensor] = field(default_factory=dict)
    scale: float | None = None
    bias: dict[int, torch.Tensor] = field(default_factory=dict)
    allowed: dict[int, torch.Tensor] = field(default_factory=dict)
    title: str = ""

    def __post_init__(self) -> None:
        self.layers = [_as_heads(w, f"layers[{i}]") for i, w in enumerate(self.layers)]
        if not self.layers:
            raise ValueError("attention data needs at least one layer of weights")
        t = len(self.tokens)
        for i, w in enumerate(self.layers):
            if w.shape[1:] != (t, t) or w.shape[0] != self.layers[0].shape[0]:
                raise ValueError(f"layers[{i}] has shape {tuple(w.shape)}; expected ({self.layers[0].shape[0]}, "
                                 f"{t}, {t}) for {t} tokens")
        if self.segments is not None and len(self.segments) != t:
            raise ValueError(f"segments has {len(self.segments)} entries for {t} tokens")
        if self.cross is not None:
            self.cross = [_as_heads(w, f"cross[{i}]") for i, w in enumerate(self.cross)]
            s = len(self.source_tokens or [])
            for i, w in enumerate(self.cross):
                if w.shape[1:] != (t, s):
                    raise ValueError(f"cross[{i}] has shape {tuple(w.shape)}; expected (heads, {t}, {s}) "
                                     f"for {t} tokens reading {s} source_tokens")

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def num_heads(self) -> int:
        return self.layers[0].shape[0]

    def to_json(self, digits: int = 4) -> dict[str, Any]:
        """Plain lists for the page, rounded: 4 decimals keep weights exact to 5e-5, a third of the size."""
        def r(x: torch.Tensor) -> Any:
            return torch.round(x.double(), decimals=digits).tolist()  # float64: no 0.12340000271 tails

        out: dict[str, Any] = {
            "title": self.title, "tokens": list(self.tokens), "causal": self.causal,
            "segments": self.segments, "layers": [r(w) for w in self.layers],
            "cross": [r(w) for w in self.cross] if self.cross is not None else None,
            "sourceTokens": self.source_tokens,
            "scale": self.scale,
            # keyed by layer number as a string: JSON objects have string keys
            "queries": {str(i): r(q) for i, q in self.queries.items()},
            "keys": {str(i): r(k) for i, k in self.keys.items()},
            "bias": {str(i): r(b) for i, b in self.bias.items()},
            "allowed": {str(i): a.int().tolist() for i, a in self.allowed.items()},
        }
        return out


def _as_heads(w: torch.Tensor, name: str) -> torch.Tensor:
    """(1, H, T, S) as the model returns it, or (H, T, S) -> (H, T, S) float on the CPU."""
    w = torch.as_tensor(w).detach().float().cpu()
    if w.dim() == 4:
        if w.size(0) != 1:
            raise ValueError(f"{name}: one sequence at a time, got a batch of {w.size(0)}")
        w = w[0]
    if w.dim() != 3:
        raise ValueError(f"{name}: expected (heads, queries, keys), got shape {tuple(w.shape)}")
    return w


def _backbone(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "backbone", model)


def _is_local(backbone: torch.nn.Module, layer_idx: int) -> bool:
    is_local = getattr(backbone, "_is_local", None)
    return bool(is_local(layer_idx)) if is_local is not None else False


@torch.no_grad()
def extract(model: torch.nn.Module, input_ids: torch.Tensor, tokens: Sequence[str], *,
            token_type_ids: torch.Tensor | None = None, neuron: bool | Sequence[int] = True,
            neuron_fallback: int = 0, title: str = "", stream: str = "content",
            order: Sequence[int] | None = None, global_tokens: Sequence[int] | None = None) -> AttentionData:
    """Run `model` on one sequence and collect its attention.

    input_ids (1, T) or (T,); `neuron`: True for queries/keys of every layer if they fit NEURON_BUDGET
    (else of layer `neuron_fallback` only), False for none, or a list of layer numbers.
    XLNet (position relative_xl): `order`, a factorization order of the T positions, becomes a perm_mask
    (each token sees the tokens before it in the order); `stream` "query" shows the query stream, every
    token predicted from its predecessors without seeing itself (Yang et al. 2019, §2.3), "content" the
    content stream (which also sees itself; without an order, full bidirectional attention).
    `global_tokens`: positions given Longformer's global attention (Beltagy et al. 2020, §3.1): they see
    and are seen by every token; the mask shows their rows and columns open.
    """
    input_ids = torch.as_tensor(input_ids)
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.size(0) != 1:
        raise ValueError(f"extract shows one sequence at a time, got a batch of {input_ids.size(0)}")
    if input_ids.size(1) != len(tokens):
        raise ValueError(f"{input_ids.size(1)} input ids but {len(tokens)} tokens")
    if token_type_ids is not None:
        token_type_ids = torch.as_tensor(token_type_ids).reshape(1, -1)
    backbone = _backbone(model)
    cfg = backbone.config
    t, h, dh = input_ids.size(1), cfg.num_heads, cfg.dim_head
    glob = None
    if global_tokens:
        if not cfg.global_attention:
            raise ValueError("global tokens are Longformer's (a config with global_attention)")
        bad = [int(i) for i in global_tokens if not 0 <= int(i) < t]
        if bad:
            raise ValueError(f"global token {bad[0]} is out of range 0..{t - 1}")
        glob = torch.zeros(1, t, dtype=torch.bool)
        glob[0, [int(i) for i in global_tokens]] = True
    if neuron is True:
        per_layer = 2 * h * t * dh
        neuron = range(cfg.num_layers) if per_layer * cfg.num_layers <= NEURON_BUDGET else [neuron_fallback]
    layers_for_neuron = sorted(set(neuron or []))
    bad = [i for i in layers_for_neuron if not 0 <= i < cfg.num_layers]
    if bad:
        raise ValueError(f"layer {bad[0]} does not exist: the model has layers 0..{cfg.num_layers - 1}")

    # The hooks see the projections' outputs (B, T, heads*d_k) before attention splits them into heads.
    caught: dict[tuple[int, str], torch.Tensor] = {}
    handles = []
    for i in layers_for_neuron:
        attn = backbone.layers[i].attn
        for name in ("q", "k", "v"):
            handles.append(getattr(attn, name).register_forward_hook(
                lambda _m, _inp, out, key=(i, name): caught.__setitem__(key, out.detach())))
    was_training = model.training
    if was_training:  # eval() on an eval model would still drop the packed CPU weights (nn/cpu_linear.py)
        model.eval()  # no dropout: the page shows the function the model computes
    device = next(model.parameters()).device
    xl, visible = _xl_inputs(backbone, t, stream, order, device)
    try:
        if glob is not None:
            xl["global_attention_mask"] = glob.to(device)
        out = backbone(input_ids=input_ids.to(device), output_attentions=True,
                       token_type_ids=token_type_ids.to(device) if token_type_ids is not None else None, **xl)
    finally:
        for handle in handles:
            handle.remove()
        if was_training:
            model.train()
    if "target_mapping" in xl:  # two streams: per layer (content, query); the hooks caught the query stream's q
        out.attentions = tuple(w[1] for w in out.attentions)
    if not out.attentions or any(w is None for w in out.attentions):
        raise ValueError(f"{type(model).__name__} returned no attention weights for output_attentions=True")

    data = AttentionData(
        tokens=list(tokens), layers=list(out.attentions), causal=bool(cfg.causal),
        segments=token_type_ids[0].tolist() if token_type_ids is not None and int(token_type_ids.max()) > 0 else None,
        # DeBERTa's content scale is 1/sqrt((1 + n) d_k): the scale attention itself uses
        scale=next((s for s in (cfg.attention_scale, backbone.layers[0].attn.scale) if s is not None), dh ** -0.5),
        title=title)
    position_ids = torch.arange(t, device=device)[None]
    rope = backbone.rope(position_ids) if getattr(backbone, "rope", None) is not None else None
    rel = getattr(backbone, "relative_bias", None)
    positions = backbone.rel_positions(t, device) if getattr(backbone, "rel_positions", None) is not None else None
    for i in layers_for_neuron:
        q = caught[(i, "q")].view(1, t, h, dh).transpose(1, 2)
        k = caught[(i, "k")].view(1, t, cfg.kv_heads, dh).transpose(1, 2)
        v = caught[(i, "v")].view(1, t, cfg.kv_heads, dh).transpose(1, 2)
        if rope is not None:  # attention rotates q and k after projecting them; so do we
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        if cfg.kv_heads != h:  # GQA: each key head serves h // kv_heads query heads
            k, v = k.repeat_interleave(h // cfg.kv_heads, dim=1), v.repeat_interleave(h // cfg.kv_heads, dim=1)
        data.queries[i], data.keys[i], data.values[i] = q[0].float().cpu(), k[0].float().cpu(), v[0].float().cpu()
        if rel is not None:
            data.bias[i] = rel(t, t)[0].float().cpu()
        if positions is not None:  # DeBERTa: c2p + p2c enter the neuron view as the bias they are to q·k
            attn = backbone.layers[i].attn
            data.bias[i] = attn.rel(q, k, attn.rel.project(positions, attn.q, attn.k), positions[1])[0].float().cpu()
        if getattr(backbone, "xl", None) is not None:  # XLNet: the relative terms, likewise (segments left out),
            # with the stream's additive mask: a query that may see nothing (the first of the order) attends
            # uniformly, as the model computes it
            table, index = backbone.xl.positions(t, 0, device)
            masks = stream_masks(t, 0, 1, cfg.causal, None, xl.get("perm_mask"), device)
            pos = XLPositions(table, index, None, masks[1] if stream == "query" else masks[0])
            attn = backbone.layers[i].attn
            data.bias[i] = attn.xl(q, k, pos, data.scale)[0].float().cpu()
        if visible is not None:
            data.allowed[i] = visible
            continue
        mask = AttentionMask.build(None, t, t, causal=cfg.causal, device=device,
                                   window=cfg.sliding_window if _is_local(backbone, i) else None,
                                   global_tokens=glob.to(device) if glob is not None else None)
        if mask.allowed is not None:
            data.allowed[i] = mask.allowed[0, 0].cpu()
        elif mask.is_causal:
            data.allowed[i] = torch.ones(t, t, dtype=torch.bool).tril()
    return data


def _xl_inputs(backbone, t: int, stream: str, order, device) -> tuple[dict, torch.Tensor | None]:
    """XLNet's perm_mask / target_mapping for `extract`, and the (T, T) keys each shown query may see."""
    if stream not in ("content", "query"):
        raise ValueError(f"stream={stream!r}: expected content or query")
    if getattr(backbone, "xl", None) is None:
        if stream == "query" or order is not None:
            raise ValueError("the query stream and factorization orders are XLNet's (position: relative_xl)")
        return {}, None
    if order is None:
        if stream == "query":
            raise ValueError("the query stream needs a factorization order (--order-seed)")
        return {}, None
    rank = torch.empty(t, dtype=torch.long)
    rank[torch.as_tensor(list(order))] = torch.arange(t)
    if sorted(int(p) for p in order) != list(range(t)):
        raise ValueError(f"order must be a permutation of the {t} positions")
    hidden = rank[None, :] >= rank[:, None]  # i may not see j: j is i itself or comes later in the order
    xl = {"perm_mask": hidden[None].float().to(device)}
    if stream == "query":
        xl["target_mapping"] = torch.eye(t, device=device)[None]  # every token predicted at its own position
        return xl, ~hidden | hidden.all(-1, keepdim=True)  # the order's first token sees nothing: uniform
    return xl, ~hidden | torch.eye(t, dtype=torch.bool)


def extract_text(model: torch.nn.Module, tokenizer, text: str, text_b: str | None = None, *,
                 neuron: bool | Sequence[int] = True, neuron_fallback: int = 0, title: str = "",
                 stream: str = "content", order_seed: int | None = None) -> AttentionData:
    """Tokenize `text` (and `text_b`, as a BERT pair with segments A/B) and extract the attention."""
    if not text or not text.strip():
        raise ValueError("--text is empty: give the sentence to look inside")
    enc = tokenizer(text, text_b, return_tensors="pt")
    types = enc.get("token_type_ids")
    t = enc["input_ids"].size(1)
    order = None if order_seed is None else torch.randperm(t, generator=torch.Generator().manual_seed(order_seed))
    if order is not None:
        title = f"{title} ({stream} stream, order {' '.join(map(str, order.tolist()))})"
    return extract(model, enc["input_ids"], enc.tokens(0), token_type_ids=types if text_b is not None else None,
                   neuron=neuron, neuron_fallback=neuron_fallback, title=title, stream=stream,
                   order=order.tolist() if order is not None else None)


def neuron_softmax(data: AttentionData, layer: int) -> torch.Tensor:
    """softmax(q·k * scale + bias) with the mask, for every head: (H, T, T). What the neuron view shows."""
    q, k = data.queries[layer], data.keys[layer]
    scores = q @ k.transpose(-1, -2) * (data.scale if data.scale is not None else q.size(-1) ** -0.5)
    if layer in data.bias:
        scores = scores + data.bias[layer]
    if layer in data.allowed:
        scores = scores.masked_fill(~data.allowed[layer].bool(), float("-inf"))
    return scores.softmax(-1)


@torch.no_grad()
def extract_seq2seq(model: torch.nn.Module, input_ids: torch.Tensor, decoder_input_ids: torch.Tensor,
                    source_tokens: Sequence[str], target_tokens: Sequence[str], *, title: str = "") -> AttentionData:
    """An encoder-decoder (`attnlab.models.seq2seq.Seq2SeqLM`) on one sentence pair: the decoder's causal
    self-attention as `layers` and its cross-attention over the source as `cross` (Vaswani et al. 2017,
    §3.2.3: queries from the decoder, keys/values from the encoder output). No neuron view."""
    input_ids, decoder_input_ids = torch.as_tensor(input_ids).reshape(1, -1), torch.as_tensor(decoder_input_ids).reshape(1, -1)
    if input_ids.size(1) != len(source_tokens) or decoder_input_ids.size(1) != len(target_tokens):
        raise ValueError(f"{input_ids.size(1)} source ids for {len(source_tokens)} tokens, "
                         f"{decoder_input_ids.size(1)} target ids for {len(target_tokens)} tokens")
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        out = model(input_ids=input_ids.to(device), decoder_input_ids=decoder_input_ids.to(device),
                    output_attentions=True)
    finally:
        model.train(was_training)
    return AttentionData(tokens=list(target_tokens), layers=[w[0] for w in out.attentions], causal=True,
                         cross=[w[0] for w in out.cross_attentions], source_tokens=list(source_tokens), title=title)
