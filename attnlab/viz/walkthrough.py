"""`attnlab info --explain`: every kind of layer in a model walked through in the notes' numbered steps
with real shapes, parameters, FLOPs and activation memory, then the totals.

Layers of one kind share a walkthrough: a BERT or GPT stack has one kind; a ModernBERT-style stack with
`sliding_window` and `config.extra["global_every"]` has global layers and local (sliding-window) ones.

Conventions: a matmul (m×k)@(k×n) costs 2·m·k·n FLOPs; the backward pass costs about twice the forward;
activation memory counts the tensors a training step keeps for the backward pass, at `bytes_per` bytes
each (4 = fp32, 2 = bf16), for one sequence.

>>> from attnlab.config import preset
>>> ex = explain_config(preset("bert-base"), seq_len=128)
>>> [(k.name, len(k.layers)) for k in ex.kinds]
[('encoder layer (bidirectional)', 12)]
>>> sum(s.params for s in ex.kinds[0].steps)   # one BERT-base layer
7087872
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ..config import ModelConfig
from .explain import Step, count, decoder_walkthrough, human, layer_walkthrough


@dataclass
class LayerKind:
    name: str
    layers: list[int]
    steps: list[Step]
    stack: int = 0  # layers in this kind's stack (0: the config's num_layers)

    @property
    def flops(self) -> int:
        return sum(s.flops for s in self.steps)

    @property
    def params(self) -> int:
        return sum(s.params for s in self.steps)

    @property
    def activations(self) -> int:
        return sum(s.activations for s in self.steps)


@dataclass
class Explanation:
    config: ModelConfig
    seq_len: int
    bytes_per: int
    kinds: list[LayerKind]
    embedding_params: int = 0
    layer_params: int = 0      # all layers, each parameter once (ALBERT's layers share one block)
    other_params: int = 0      # final norm, pooler, heads (not tied to the embeddings)
    head_flops: int = 0        # LM / MLM head projection onto the vocabulary, when the model has one
    total_params: int = 0

    @property
    def layer_flops(self) -> int:
        return sum(k.flops * len(k.layers) for k in self.kinds)

    @property
    def forward_flops(self) -> int:
        return self.layer_flops + self.head_flops

    @property
    def activations(self) -> int:
        """Elements kept for backward: the embedding output plus every layer's."""
        return self.seq_len * self.config.hidden_size + sum(k.activations * len(k.layers) for k in self.kinds)

    @property
    def attention_scores(self) -> int:
        """Elements of the score and probability matrices (heads × queries × keys), over all layers."""
        return sum(s.activations * len(k.layers) for k in self.kinds for s in k.steps if "scores" in s.text)

    @property
    def kv_cache(self) -> int:
        """Elements a decoder's KV cache holds after seq_len tokens: K and V per layer and key/value head."""
        c = self.config
        return 2 * c.num_layers * self.seq_len * c.kv_heads * c.dim_head


def is_local_layer(cfg: ModelConfig, i: int) -> bool:
    """The rule `Encoder._is_local` applies: every layer is local under a sliding window, except every
    `global_every`-th one (counting from layer 0) when that is set."""
    if not cfg.sliding_window:
        return False
    every = cfg.extra.get("global_every")
    return not (every and i % every == 0)


def layer_kinds(cfg: ModelConfig, seq_len: int) -> list[LayerKind]:
    base = "decoder layer (causal)" if cfg.causal else "encoder layer (bidirectional)"
    if cfg.kv_heads != cfg.num_heads:
        base += f", {'MQA' if cfg.kv_heads == 1 else 'GQA'} {cfg.num_heads}:{cfg.kv_heads}"
    if not cfg.sliding_window:
        return [LayerKind(base, list(range(cfg.num_layers)), layer_walkthrough(cfg, seq_len, local=False))]
    local = [i for i in range(cfg.num_layers) if is_local_layer(cfg, i)]
    glob = [i for i in range(cfg.num_layers) if not is_local_layer(cfg, i)]
    kinds = []
    if glob:
        kinds.append(LayerKind(f"{base}, global attention", glob, layer_walkthrough(cfg, seq_len, local=False)))
    if local:
        kinds.append(LayerKind(f"{base}, local attention (window ±{cfg.sliding_window - 1})", local,
                               layer_walkthrough(cfg, seq_len, local=True)))
    return kinds


def explain_config(cfg: ModelConfig, seq_len: int, bytes_per: int = 4) -> Explanation:
    """The walkthrough from a config alone (no parameter totals outside the layers)."""
    return Explanation(cfg, seq_len, bytes_per, layer_kinds(cfg, seq_len))


def explain_model(model: nn.Module, seq_len: int, bytes_per: int = 4) -> Explanation:
    """The walkthrough plus totals for a model (a meta-device skeleton is enough)."""
    cfg: ModelConfig = model.config
    ex = explain_config(cfg, seq_len, bytes_per)
    ex.total_params = count(model)
    if isinstance(getattr(model, "encoder", None), nn.Module) and isinstance(getattr(model, "decoder", None), nn.Module):
        stacks = [model.encoder, model.decoder]  # an encoder-decoder: both stacks' embeddings and layers
        dec = model.decoder.config
        for kind in ex.kinds:
            kind.name = kind.name.replace("encoder layer", "encoder stack: layer")
            kind.stack = cfg.num_layers
        # the source is taken as long as the target (seq_len tokens each)
        ex.kinds.append(LayerKind("decoder stack: layer (causal self-attention + cross-attention)", list(range(dec.num_layers)),
                                  decoder_walkthrough(dec, seq_len), stack=dec.num_layers))
    else:
        stacks = [getattr(model, "backbone", model)]
    ex.embedding_params = count(nn.ModuleList(s.embeddings for s in stacks))
    ex.layer_params = count(nn.ModuleList(layer for s in stacks for layer in s.layers))
    ex.other_params = ex.total_params - ex.embedding_params - ex.layer_params
    # a head that maps to the vocabulary is one (n×d)@(d×V) matmul; other heads are small
    if getattr(model, "lm_head", None) is not None or getattr(model, "mlm", None) is not None:
        ex.head_flops = 2 * seq_len * cfg.hidden_size * cfg.vocab_size
    return ex


def _size(elements: int, bytes_per: int) -> str:
    b = elements * bytes_per
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if b >= size:
            return f"{b / size:.1f} {unit}"
    return f"{b} B"


def _layer_list(layers: list[int]) -> str:
    if layers == list(range(layers[0], layers[-1] + 1)):
        return f"{layers[0]}" if len(layers) == 1 else f"{layers[0]}–{layers[-1]}"
    return ", ".join(map(str, layers)) if len(layers) <= 12 else ", ".join(map(str, layers[:11])) + ", …"


def format_explanation(ex: Explanation) -> str:
    cfg, n, bp = ex.config, ex.seq_len, ex.bytes_per
    dtype = {4: "fp32", 2: "bf16/fp16", 1: "int8"}.get(bp, f"{bp}-byte")
    lines = [f"walkthrough: one sequence of {n} tokens, d_model={cfg.hidden_size}, {cfg.num_heads} heads of "
             f"d_k={cfg.dim_head}" + (f", {cfg.kv_heads} key/value heads" if cfg.kv_heads != cfg.num_heads else "")
             + f"; activations in {dtype} ({bp} bytes)"]
    if cfg.position == "learned" and n > cfg.max_position_embeddings:
        lines.append(f"note: {n} tokens exceed max_position_embeddings={cfg.max_position_embeddings}; the model "
                     "itself cannot run this length (the arithmetic below is still what it would cost)")
    for letter, kind in zip("ABCDEFGH", ex.kinds):
        lines.append(f"layer type {letter}: {kind.name} — layers {_layer_list(kind.layers)} "
                     f"({len(kind.layers)} of {kind.stack or cfg.num_layers})")
        lines.append(f"  {'':>3} {'step':<100} {'params':>12} {'FLOPs':>11} {'activations':>12}")
        for i, step in enumerate(kind.steps, 1):
            params = f"{step.params:,}" if step.params else ""
            flops = human(step.flops) + "F" if step.flops else ""
            act = _size(step.activations, bp) if step.activations else ""
            lines.append(f"  {i:>2}. {step.text:<100} {params:>12} {flops:>11} {act:>12}")
        lines.append(f"  {'':>3} {'per layer':<100} {kind.params:>12,} {human(kind.flops) + 'F':>11} "
                     f"{_size(kind.activations, bp):>12}")
    lines.append("totals:")
    if ex.total_params:
        shared = " (shared across layers)" if ex.layer_params < sum(k.params * len(k.layers) for k in ex.kinds) else ""
        lines.append(f"  parameters: embeddings {ex.embedding_params:,} + layers {ex.layer_params:,}{shared} + other "
                     f"{ex.other_params:,} = {ex.total_params:,}")
    per = " + ".join(f"{len(k.layers)} × {human(k.flops)}F" for k in ex.kinds)
    head = f" + head {human(ex.head_flops)}F" if ex.head_flops else ""
    lines.append(f"  forward FLOPs: {per}{head} = {human(ex.forward_flops)}FLOP "
                 f"({human(ex.forward_flops / n)}FLOP per token); a training step ≈ 3× = "
                 f"{human(3 * ex.forward_flops)}FLOP")
    attn_part = ex.attention_scores
    lines.append(f"  activation memory kept for backward: {_size(ex.activations, bp)} per sequence "
                 f"(attention scores/probabilities {_size(attn_part, bp)} of it: grows with {n}²)")
    if cfg.causal:
        lines.append(f"  KV cache when generating: 2 × {cfg.num_layers} layers × {n} tokens × {cfg.kv_heads} "
                     f"key/value heads × {cfg.dim_head} = {_size(ex.kv_cache, bp)} per sequence"
                     + (f" ({cfg.num_heads // cfg.kv_heads}× less than with {cfg.num_heads} KV heads)"
                        if cfg.kv_heads != cfg.num_heads else ""))
    return "\n".join(lines)
