"""What a model is made of, in the notes' terms: parameters per component, and one layer walked through
step by step with real shapes and FLOPs (a matmul (m×k)@(k×n) costs 2·m·k·n FLOPs).

>>> from attnlab.config import preset
>>> steps = layer_walkthrough(preset("bert-base"), seq_len=512)
>>> steps[0].text
'project to Q, K, V: three (512×768)@(768×768) matmuls'
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..config import ModelConfig


@dataclass
class Step:
    text: str
    flops: int = 0
    params: int = 0
    activations: int = 0  # elements the step produces (what training keeps for the backward pass)


def _mm(m: int, k: int, n: int) -> int:
    return 2 * m * k * n


def count(module: nn.Module | None) -> int:
    if module is None:
        return 0
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())


def build_on_meta(cls, config: ModelConfig) -> nn.Module:
    """Build a model without allocating or initialising its weights: counting needs only shapes."""
    with torch.device("meta"):
        return cls(config)


def _factorized(backbone: nn.Module) -> str:
    """ALBERT's factorized embeddings (Lan et al. 2020, §3.1): rows of size E < H plus an E×H projection,
    instead of rows of size H. Names the saving against the unfactorized table."""
    emb = backbone.embeddings
    if getattr(emb, "project", None) is None:
        return ""
    e, h = emb.project.in_features, emb.project.out_features
    rows = sum(m.num_embeddings for m in (emb.tok, emb.pos, emb.seg, getattr(emb, "lang", None)) if m is not None)
    norm = count(emb.norm) // e if emb.norm is not None else 0  # LayerNorm vectors of size E (1 or 2)
    saving = (rows + norm) * (h - e) - count(emb.project)
    return f" (factorized E={e} → H={h}, saving {saving:,})"


def parameter_breakdown(model: nn.Module) -> list[tuple[str, int]]:
    """(component, parameters) rows for a backbone or a wrapper; the rows add up to the total."""
    if isinstance(getattr(model, "encoder", None), nn.Module) and isinstance(getattr(model, "decoder", None), nn.Module):
        return _seq2seq_breakdown(model)
    backbone = getattr(model, "backbone", model)
    rows: list[tuple[str, int]] = [("embeddings" + _factorized(backbone), count(backbone.embeddings))]
    for extra, label in (("rope", "rope"), ("relative_bias", "relative bias"),
                         ("rel_positions", "relative-position table (DeBERTa, shared by all layers)"),
                         ("xl", "query-stream start vector w (XLNet mask_emb)")):
        if count(getattr(backbone, extra, None)):
            rows.append((label, count(getattr(backbone, extra))))
    layers = list(backbone.layers)
    if layers:
        first = layers[0]
        per_layer = count(first)
        shared = len({id(layer) for layer in layers}) == 1 and len(layers) > 1
        xl = count(getattr(first.attn, "xl", None))
        parts = [f"attention {count(first.attn) - xl:,}" + (f" + relative W_r, u, v, segments {xl:,}" if xl else "")]
        if first.cross_attn is not None:
            parts.append(f"cross-attention {count(first.cross_attn):,}")
        parts += [f"feed-forward {count(first.ffn):,}",
                  f"norms {count(first.attn_norm) + count(first.ffn_norm) + count(first.cross_norm):,}"]
        total_layers = per_layer if shared else per_layer * len(layers)
        label = (f"layers: {len(layers)} sharing one block, saving {per_layer * (len(layers) - 1):,}" if shared
                 else f"layers: {len(layers)} × {per_layer:,}")
        rows.append((f"{label} ({', '.join(parts)})", total_layers))
    if count(getattr(backbone, "final_norm", None)):
        rows.append(("final norm", count(backbone.final_norm)))
    if count(getattr(backbone, "pooler", None)):
        rows.append(("pooler", count(backbone.pooler)))
    if backbone is not model:
        seen = {id(p) for p in backbone.parameters()}
        for name, child in model.named_children():
            if child is backbone:
                continue
            own = sum(p.numel() for p in {id(p): p for p in child.parameters()}.values() if id(p) not in seen)
            seen |= {id(p) for p in child.parameters()}
            tied = " (decoder tied to the token embedding)" if own < count(child) else ""
            rows.append((f"head {name}{tied}", own))
    return rows


def layer_walkthrough(cfg: ModelConfig, seq_len: int, local: bool | None = None) -> list[Step]:
    """One block's steps with the shapes of a single sequence of `seq_len` tokens. `local`: describe a
    sliding-window layer (True) or a global one (False); None describes the config as a whole."""
    n, d, h, hk, dh, ff = seq_len, cfg.hidden_size, cfg.num_heads, cfg.kv_heads, cfg.dim_head, cfg.intermediate_size
    b = 1 if cfg.bias else 0
    bq = b if cfg.qkv_bias is None else int(cfg.qkv_bias)  # GPT-Neo: Q/K/V without bias, output with one
    steps: list[Step] = []
    if hk == h:
        steps.append(Step(f"project to Q, K, V: three ({n}×{d})@({d}×{h * dh}) matmuls",
                          3 * _mm(n, d, h * dh), 3 * (d * h * dh + bq * h * dh), 3 * n * h * dh))
    else:
        kind = "MQA" if hk == 1 else "GQA"
        steps.append(Step(f"project to Q: ({n}×{d})@({d}×{h * dh}); K and V ({kind}, {hk} key/value heads): "
                          f"two ({n}×{d})@({d}×{hk * dh}) matmuls",
                          _mm(n, d, h * dh) + 2 * _mm(n, d, hk * dh),
                          d * h * dh + 2 * d * hk * dh + bq * (h + 2 * hk) * dh, n * (h + 2 * hk) * dh))
    steps.append(Step(f"split into {h} heads of ({n}×{dh})"
                      + (f"; each K/V head is shared by {h // hk} query heads" if hk != h else "")))
    if cfg.position == "rope":
        rd = cfg.rotary_dim  # GPT-NeoX rotates only the first rotary_dim dimensions of each head
        part = f", first {rd} of {dh} dimensions per head" if rd < dh else ""
        steps.append(Step(f"rotate Q and K by position (RoPE, θ={cfg.rope_theta:g}{part})", 3 * n * (h + hk) * rd,
                          activations=n * (h + hk) * dh))
    scale = "" if cfg.attention_scale is None else f" (scale {cfg.attention_scale:g} instead of 1/√{dh})"
    bias = " + relative position bias" if cfg.position == "relative_bias" else ""
    root = f"√{dh}"
    if cfg.position == "relative_xl":
        steps += _relative_xl_steps(cfg, n)
        bias = " + (Q+v)R_{i-j}ᵀ + u·K" + (" + segments" if cfg.relative_segments else "")
    if cfg.disentangled_attention:
        steps += _disentangled_steps(cfg, n)
        bias = "".join(f" + {kind}" for kind in cfg.disentangled_attention)
        root = f"√({1 + len(cfg.disentangled_attention)}·{dh})"
    visible = n
    mask = "causal mask: each token sees itself and earlier tokens" if cfg.causal else "every token sees every token"
    if cfg.sliding_window and local is not False:
        w = cfg.sliding_window - 1
        if local:
            mask = (f"causal and local: each token sees itself and {w} earlier tokens" if cfg.causal
                    else f"local: each token sees the tokens within ±{w}")
        else:
            mask += f"; local layers see ±{w} tokens"
        visible = min(n, cfg.sliding_window if cfg.causal else 2 * cfg.sliding_window - 1)
    # scores and probabilities are both (heads × n × n): the quadratic part of the memory
    formula = (f"softmax((QKᵀ{bias})/{root})" if cfg.disentangled_attention or cfg.position == "relative_xl"
               else f"softmax(QKᵀ/{root}{bias})")
    steps.append(Step(f"scores {formula}: ({h}×{n}×{n}){scale}; {mask}",
                      h * _mm(n, dh, n) + 5 * h * n * n, activations=2 * h * n * n))
    steps.append(Step(f"weighted sum of values: ({h}×{n}×{n})@({h}×{n}×{dh}) -> ({h}×{n}×{dh})", h * _mm(n, n, dh),
                      activations=h * n * dh))
    bo = 0 if cfg.position == "relative_xl" else b  # Transformer-XL's output projection has no bias
    steps.append(Step(f"concatenate heads -> ({n}×{h * dh}), output projection ({n}×{h * dh})@({h * dh}×{d})",
                      _mm(n, h * dh, d), h * dh * d + bo * d, n * d))
    norm = "LayerNorm" if cfg.norm == "layernorm" else "RMSNorm"
    norm_params = d * (2 if cfg.norm == "layernorm" and cfg.bias else 1)
    if cfg.norm_placement == "post":
        steps.append(Step(f"add & norm: {norm}(x + attention(x)) ({n}×{d})", 8 * n * d, norm_params, n * d))
    elif cfg.parallel_residual:
        steps.append(Step(f"pre-norm, parallel: {norm}1(x) feeds attention, {norm}2(x) the FFN, both from x ({n}×{d})",
                          8 * n * d, norm_params, n * d))
    else:
        steps.append(Step(f"pre-norm: x + attention({norm}(x)) ({n}×{d})", 8 * n * d, norm_params, n * d))
    if cfg.is_glu:
        act = "GELU" if cfg.activation == "geglu" else "SiLU"
        steps.append(Step(f"FFN {d}→{ff}→{d} ({cfg.activation}: {act}(x W_gate) ⊙ (x W_up), then W_down): "
                          f"two ({n}×{d})@({d}×{ff}) and one ({n}×{ff})@({ff}×{d})",
                          3 * _mm(n, d, ff), 3 * d * ff + b * (2 * ff + d), 3 * n * ff + n * d))
    else:
        act = {"gelu": "GELU", "gelu_tanh": "GELU (tanh)", "relu": "ReLU", "silu": "SiLU",
               "leaky_relu": "LeakyReLU"}[cfg.activation]
        steps.append(Step(f"FFN {d}→{ff}→{d} ({act}): ({n}×{d})@({d}×{ff}), then ({n}×{ff})@({ff}×{d})",
                          2 * _mm(n, d, ff), 2 * d * ff + b * (ff + d), 2 * n * ff + n * d))
    if cfg.num_experts:  # mixture of experts: E such FFNs held, each token runs through its top-k of them
        e, k, ffn = cfg.num_experts, cfg.experts_top_k, steps.pop()
        steps.append(Step(f"router: ({n}×{d})@({d}×{e}), softmax, top-{k} of {e} experts per token",
                          _mm(n, d, e), d * e, n * e))
        steps.append(Step(f"{k} of {e} experts per token, each an {ffn.text}", k * ffn.flops, e * ffn.params,
                          k * ffn.activations))
    if cfg.norm_placement == "post":
        steps.append(Step(f"add & norm: {norm}(x + FFN(x)) ({n}×{d})", 8 * n * d, norm_params, n * d))
    elif cfg.parallel_residual:
        steps.append(Step(f"parallel residual: x + attention({norm}1(x)) + FFN({norm}2(x)) ({n}×{d})",
                          8 * n * d, norm_params, n * d))
    else:
        steps.append(Step(f"pre-norm: x + FFN({norm}(x)) ({n}×{d})", 8 * n * d, norm_params, n * d))
    if visible < n:  # a local layer only computes the band of the score matrix it keeps
        steps.append(Step(f"(a local layer needs only {visible} of {n} scores per query)"))
    return steps


def _relative_xl_steps(cfg: ModelConfig, n: int) -> list[Step]:
    """Transformer-XL / XLNet (Dai et al. 2019, §3.3; Yang et al. 2019, §2.5): the 2n sinusoids of the distances
    projected by W_r, (Q + v) against them, each (i, j) reading distance i - j; u·K; segment terms. In
    pretraining XLNet's query stream repeats the attention and FFN steps for each predicted token."""
    d, h, dh, r = cfg.hidden_size, cfg.num_heads, cfg.dim_head, 2 * n
    steps = [Step(f"relative positions: the {r} sinusoids of distances {n}..{-n + 1} through W_r: ({r}×{d})@({d}×{h * dh}); "
                  f"(Q+v)R ({h}×{n}×{r}), each (i, j) reads distance i-j; u·K ({h}×{n})",
                  _mm(r, d, h * dh) + h * _mm(n, dh, r) + h * _mm(1, dh, n), d * h * dh + 2 * h * dh,
                  r * h * dh + 2 * h * n * r)]
    if cfg.relative_segments:
        steps.append(Step(f"relative segments: (Q+b)·s for same / different segment ({h}×{n}×2), each (i, j) "
                          "reads one", h * _mm(n, dh, 2), 3 * h * dh, h * n * 2))
    return steps


def _disentangled_steps(cfg: ModelConfig, n: int) -> list[Step]:
    """DeBERTa (He et al. 2021, §3.1): the shared table P of 2k relative positions projected to K_r / Q_r, then
    content-to-position Q K_rᵀ and position-to-content K Q_rᵀ, each read at δ(i, j) for every (i, j)."""
    d, h, dh, k2 = cfg.hidden_size, cfg.num_heads, cfg.dim_head, 2 * cfg.relative_span
    steps = []
    for kind, (table, against) in (("c2p", ("K_r", "Q")), ("p2c", ("Q_r", "K"))):
        if kind not in cfg.disentangled_attention:
            continue
        w = table[0].lower()
        own = f"the layer's own W_{w}" if cfg.share_att_key else f"W_{w},r"
        params = 0 if cfg.share_att_key else d * h * dh + h * dh
        steps.append(Step(f"{kind}: project the {k2}-row position table to {table} ({own}): "
                          f"({k2}×{d})@({d}×{h * dh}); "
                          f"{against}{table}ᵀ ({h}×{n}×{k2}), each (i, j) reads column δ(i, j)",
                          _mm(k2, d, h * dh) + h * _mm(n, dh, k2), params, k2 * h * dh + 2 * h * n * k2))
    return steps


def cross_attention_steps(cfg: ModelConfig, n: int, m: int) -> list[Step]:
    """A decoder block's encoder-decoder attention (Vaswani et al. 2017, §3.2.3): queries from the n target
    positions, keys and values from the encoder's output over m source tokens."""
    d, h, hk, dh = cfg.hidden_size, cfg.num_heads, cfg.kv_heads, cfg.dim_head
    b = 1 if cfg.bias else 0
    norm = "LayerNorm" if cfg.norm == "layernorm" else "RMSNorm"
    norm_params = d * (2 if cfg.norm == "layernorm" and cfg.bias else 1)
    return [
        Step(f"cross-attention: Q = decoder ({n}×{d})@({d}×{h * dh}); K, V = encoder output, two "
             f"({m}×{d})@({d}×{hk * dh})",
             _mm(n, d, h * dh) + 2 * _mm(m, d, hk * dh), d * h * dh + 2 * d * hk * dh + b * (h + 2 * hk) * dh,
             n * h * dh + 2 * m * hk * dh),
        Step(f"cross scores softmax(QKᵀ/√{dh}): ({h}×{n}×{m}); every target token sees every source token",
             h * _mm(n, dh, m) + 5 * h * n * m, activations=2 * h * n * m),
        Step(f"weighted sum of the source values: ({h}×{n}×{m})@({h}×{m}×{dh}) -> ({h}×{n}×{dh})",
             h * _mm(n, m, dh), activations=h * n * dh),
        Step(f"concatenate heads, output projection ({n}×{h * dh})@({h * dh}×{d})", _mm(n, h * dh, d),
             h * dh * d + b * d, n * d),
        Step(f"add & norm: {norm}(x + cross(x, enc)) ({n}×{d})" if cfg.norm_placement == "post"
             else f"pre-norm: x + cross({norm}(x), enc) ({n}×{d})", 8 * n * d, norm_params, n * d),
    ]


def decoder_walkthrough(cfg: ModelConfig, seq_len: int, source_len: int | None = None) -> list[Step]:
    """One encoder-decoder decoder block: causal self-attention, cross-attention, FFN (`cfg` is the
    decoder stack's config)."""
    steps = layer_walkthrough(cfg, seq_len)
    ffn = next(i for i, s in enumerate(steps) if s.text.startswith("FFN"))
    return steps[:ffn] + cross_attention_steps(cfg, seq_len, source_len or seq_len) + steps[ffn:]


def human(n: float) -> str:
    for unit, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} "


def describe(model: nn.Module, seq_len: int = 128, title: str = "", walkthrough: bool = True) -> str:
    """The text `attnlab info` prints; `walkthrough=False` stops after the parameter count (`--explain`
    prints the longer walkthrough of `viz/walkthrough.py` instead)."""
    cfg: ModelConfig = model.config
    lines = [f"model: {title or type(model).__name__}  ({type(model).__name__}, model_type={cfg.model_type})"]
    lines.append("config:")
    for key in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size",
                "max_position_embeddings", "type_vocab_size", "position", "norm", "norm_placement", "activation",
                "bias", "causal", "sliding_window", "norm_eps", "tie_word_embeddings"):
        value = getattr(cfg, key)
        if value is not None:
            lines.append(f"  {key:<24} {value}")
    for key, default in (("attention_scale", None), ("qkv_bias", None), ("rotary_fraction", 1.0),
                         ("parallel_residual", False), ("disentangled_attention", []), ("position_buckets", 0),
                         ("max_relative_positions", None), ("share_att_key", False), ("relative_segments", False),
                         ("mem_len", None), ("reuse_len", None), ("num_languages", 0)):  # shown only where set
        if getattr(cfg, key) != default:
            lines.append(f"  {key:<24} {getattr(cfg, key)}")
    lines.append("parameters per component:")
    rows = parameter_breakdown(model)
    for name, n in rows:
        lines.append(f"  {name:<72} {n:>14,}")
    total = count(model)
    lines.append(f"parameters: {total:,}")
    if not walkthrough:
        return "\n".join(lines)
    steps = layer_walkthrough(cfg, seq_len)
    lines.append(f"one layer, one sequence of {seq_len} tokens (d_model={cfg.hidden_size}, "
                 f"{cfg.num_heads} heads of d_k={cfg.dim_head}):")
    for i, step in enumerate(steps, 1):
        cost = f"{human(step.flops)}FLOPs" if step.flops else ""
        lines.append(f"  {i:>2}. {step.text:<96} {cost:>14}")
    per_layer = sum(s.flops for s in steps)
    lines.append(f"FLOPs per layer: {human(per_layer)}FLOP; {cfg.num_layers} layers: "
                 f"{human(per_layer * cfg.num_layers)}FLOP per forward pass of {seq_len} tokens "
                 f"(≈ 2 × non-embedding parameters × tokens + attention)")
    return "\n".join(lines)


def _seq2seq_breakdown(model: nn.Module) -> list[tuple[str, int]]:
    """Encoder rows, decoder rows, output projection; a tensor shared between them counts once, where
    it first appears (the token embedding of a shared-vocabulary model, a tied output projection)."""
    seen = {id(p) for p in model.encoder.parameters()}
    rows = [(f"encoder {name}", n) for name, n in parameter_breakdown(model.encoder)]
    for name, n in parameter_breakdown(model.decoder):
        if name.startswith("embeddings") and id(model.decoder.embeddings.tok.weight) in seen:
            n = sum(p.numel() for p in model.decoder.embeddings.parameters() if id(p) not in seen)
            name += " (token embedding shared with the encoder)"
        rows.append((f"decoder {name}", n))
    seen |= {id(p) for p in model.decoder.parameters()}
    for name, child in model.named_children():
        if child is model.encoder or child is model.decoder:
            continue
        own = sum(p.numel() for p in {id(p): p for p in child.parameters()}.values() if id(p) not in seen)
        seen |= {id(p) for p in child.parameters()}
        rows.append((f"{name}" + (" (tied to the token embedding)" if own < count(child) else ""), own))
    return rows
