"""One typed config for every architecture in the notes.

Every variant is a switch here, not a subclass: BERT is `ModelConfig()` with its defaults, GPT-2 is
`causal=True, norm_placement="pre", activation="gelu_tanh"`, LLaMA adds `norm="rmsnorm",
activation="swiglu", position="rope", bias=False, num_kv_heads < num_heads`, and so on.
Presets are named configs (data), see `PRESETS` and `preset()`.

>>> cfg = preset("bert-base")
>>> cfg.hidden_size // cfg.num_heads   # head size d_k in the notes
64
"""
from __future__ import annotations

import copy
import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A config value that cannot describe a model; the message names the field and value."""


class CheckpointError(ValueError):
    """A checkpoint that does not fit the model: names the file, the tensors and the shapes."""


def first_line(err: BaseException) -> str:
    """The first line of an error message (torch's unpickling errors run to a page)."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


POSITIONS = ("learned", "sinusoidal", "rope", "relative_bias", "none",
             "relative_xl")  # Transformer-XL / XLNet relative sinusoids + u, v biases (nn/relative_xl.py)
NORMS = ("layernorm", "rmsnorm")
PLACEMENTS = ("post", "pre")
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "geglu", "swiglu", "geglu_tanh",  # geglu_tanh: T5 v1.1 "gated-gelu"
               "leaky_relu")  # max(x, 0.01 x) (Maas et al. 2013): a small gradient for negative inputs
ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "tiled")  # tiled: FlashAttention's algorithm (nn/flash.py)
ATTENTION_KINDS = ("softmax",
                   "linear",  # elu(x)+1 kernel, O(T) (Katharopoulos et al. 2020; nn/linear_attention.py)
                   "block_sparse")  # BigBird blocks, O(T) (Zaheer et al. 2020; nn/block_sparse.py)
CLASSIFIER_POOLINGS = ("cls", "mean")  # what a sequence classifier reads: BERT's pooled [CLS], or a masked mean


def type_mismatch(value: Any, annotation: Any) -> str | None:
    """None if `value` fits the dataclass field annotation (a string such as "int | None"), else what it
    should be. A float field takes an int; bool is not a number; floats must be finite."""
    kinds = [k.strip() for k in str(annotation).split("|")]
    if value is None and "None" in kinds:
        return None
    base, _, inner = kinds[0].partition("[")
    if base == "bool":
        ok, want = isinstance(value, bool), "true or false"
    elif base == "int":
        ok, want = type(value) is int, "an integer"
    elif base == "float":
        ok, want = type(value) in (int, float) and math.isfinite(value), "a finite number"
    elif base == "str":
        ok, want = isinstance(value, str), "a string"
    elif base == "list":
        ok = isinstance(value, list) and (inner != "str]" or all(isinstance(v, str) for v in value))
        want = "a list of strings" if inner == "str]" else "a list"
    elif base == "dict":
        ok, want = isinstance(value, dict) and all(isinstance(k, str) for k in value), "a mapping with string keys"
    else:  # Any, or a type with no rule here: not checked
        return None
    if ok:
        return None
    return want + (" or null" if "None" in kinds else "")


def _show(value: Any, limit: int = 60) -> str:
    """repr(value), cut short: a message names a bad value without reprinting a whole file."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


@dataclass
class ModelConfig:
    # --- what kind of model and which checkpoint family it maps onto
    model_type: str = "bert"            # interop family: names the HF state-dict table
    vocab_size: int = 30522
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    num_kv_heads: int | None = None     # None = num_heads (MHA); 1 = MQA; in between = GQA
    head_dim: int | None = None         # None = hidden_size // num_heads
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2            # segment (token type) embeddings; 0 = none
    embedding_size: int | None = None   # ALBERT's factorized embeddings (E < H); None = hidden_size
    # XLM's language embeddings (Lample & Conneau 2019, §3.1 and Figure 1): one vector per language added to
    # each token's input, chosen by `langs` (B, T) in forward; 0 = none (XLM-R drops them, Conneau et al. 2020)
    num_languages: int = 0

    # --- the switches of the notes
    position: str = "learned"
    norm: str = "layernorm"
    norm_placement: str = "post"        # post: LN(x + f(x)) as in BERT; pre: x + f(LN(x)) as in GPT-2
    activation: str = "gelu"
    bias: bool = True                   # biases in linear layers (and LayerNorm)
    causal: bool = False
    sliding_window: int | None = None   # local attention: each query sees keys within this distance
    attention_kind: str = "softmax"     # softmax | linear (Katharopoulos et al. 2020) | block_sparse (BigBird)
    global_attention: bool = False      # Longformer: tokens in global_attention_mask attend everywhere with own Q/K/V
    sparse_block_size: int = 64         # block_sparse (BigBird): tokens per block
    num_random_blocks: int = 3          # block_sparse (BigBird): random key blocks per query block
    attention_scale: float | None = None  # None = 1/sqrt(head_dim) (T5 and GPT-Neo use 1.0)
    qkv_bias: bool | None = None        # biases on the Q/K/V projections; None = `bias` (GPT-Neo: none, output has one)
    rotary_fraction: float = 1.0        # share of each head's dimensions RoPE rotates (GPT-NeoX/Pythia: 0.25)
    parallel_residual: bool = False     # x + attn(LN1 x) + ffn(LN2 x) in one step (GPT-J, GPT-NeoX; Wang & Komatsuzaki 2021)
    embedding_norm: bool = True         # LayerNorm after the embeddings (BERT); GPT-2 has none
    scale_embeddings: bool = False      # token embeddings times sqrt(hidden_size) (Vaswani et al. 2017, §3.4)
    final_norm: bool | None = None      # None = True for pre-LN stacks, False for post-LN
    pooler: bool = True                 # BERT's tanh pooler over [CLS]
    # the sequence classifier's input: "cls" = the pooler over [CLS] (BERT §4.1); "mean" = the mean of the
    # last hidden states over real tokens, how sentence-transformers models (all-MiniLM-L6-v2) are trained
    # (Reimers & Gurevych 2019, §3) and read by SetFit; such a classifier has no pooler
    classifier_pooling: str = "cls"
    tie_word_embeddings: bool = True
    share_layers: bool = False          # ALBERT: one block's parameters reused by every layer (Lan et al. 2020, §3.1)
    # mixture of experts (Shazeer et al. 2017; Mixtral, Jiang et al. 2024): the FFN becomes `num_experts`
    # FFNs of intermediate_size and a router sending each token to its `experts_top_k` best; 0 = dense FFN
    num_experts: int = 0
    experts_top_k: int = 2
    router_aux_loss_coef: float = 0.0   # load-balancing loss weight in training (Fedus et al. 2021, eq. 4)
    router_z_loss_coef: float = 0.0     # router z-loss weight (Zoph et al. 2022, ST-MoE eq. 5); 0 = off
    # DeBERTa's disentangled attention (He et al. 2021, §3.1; nn/disentangled.py): besides content-to-content,
    # "c2p" (content-to-position) and/or "p2c" (position-to-content) scores from one shared table of relative
    # position embeddings; [] = off. position_buckets > 0 buckets distances logarithmically beyond
    # position_buckets/2 up to max_relative_positions (None = max_position_embeddings; He et al. 2021 §5.3);
    # share_att_key projects the position table with the layer's own W_q/W_k (v2); relative_embedding_norm
    # puts a LayerNorm on the table (v2's norm_rel_ebd)
    disentangled_attention: list[str] = field(default_factory=list)
    position_buckets: int = 0
    max_relative_positions: int | None = None
    share_att_key: bool = False
    relative_embedding_norm: bool = False
    # Transformer-XL / XLNet (position: relative_xl; nn/relative_xl.py): relative_segments adds XLNet's
    # relative segment encodings (Yang et al. 2019, §2.5), read from token_type_ids; mem_len = how many
    # hidden states per layer a forward returns as `mems` for the next segment (Dai et al. 2019, §3.2; None:
    # all), reuse_len = how many tokens of the current segment go into them (None: all)
    relative_segments: bool = False
    mem_len: int | None = None
    reuse_len: int | None = None

    # --- numbers
    norm_eps: float = 1e-12
    dropout: float = 0.1                # hidden dropout (embeddings, sublayer outputs)
    attention_dropout: float = 0.1      # on the attention probabilities
    initializer_range: float = 0.02
    rope_theta: float = 10000.0
    relative_num_buckets: int = 32
    relative_max_distance: int = 128
    pad_token_id: int | None = 0
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    # --- how to run it (not architecture)
    attn_implementation: str = "sdpa"   # sdpa: fused kernel; eager: explicit softmax(QK^T/sqrt(d))V; tiled: O(T) memory

    extra: dict[str, Any] = field(default_factory=dict)  # family-specific values kept for round trips

    def __post_init__(self) -> None:
        self.validate()

    # ------------------------------------------------------------------ derived values
    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads if self.num_kv_heads is not None else self.num_heads

    @property
    def dim_head(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_heads

    @property
    def emb_size(self) -> int:
        return self.embedding_size if self.embedding_size is not None else self.hidden_size

    @property
    def has_final_norm(self) -> bool:
        return self.final_norm if self.final_norm is not None else self.norm_placement == "pre"

    @property
    def rotary_dim(self) -> int:
        """Dimensions per head that RoPE rotates (the first ones); the rest pass through (GPT-NeoX)."""
        return int(self.dim_head * self.rotary_fraction)

    @property
    def relative_span(self) -> int:
        """DeBERTa: k, the largest relative distance (or bucket) told apart; the table has 2k rows."""
        if self.position_buckets > 0:
            return self.position_buckets
        return self.max_relative_positions or self.max_position_embeddings

    @property
    def is_glu(self) -> bool:
        return self.activation in ("geglu", "swiglu", "geglu_tanh")

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        def bad(name: str, why: str) -> ConfigError:
            return ConfigError(f"config: {name}={_show(getattr(self, name))} {why}")

        self._check_types()
        for name, allowed in (("position", POSITIONS), ("norm", NORMS), ("norm_placement", PLACEMENTS),
                              ("activation", ACTIVATIONS), ("attn_implementation", ATTN_IMPLEMENTATIONS),
                              ("attention_kind", ATTENTION_KINDS),
                              ("classifier_pooling", CLASSIFIER_POOLINGS)):
            if getattr(self, name) not in allowed:
                raise bad(name, f"is not one of {', '.join(allowed)}")
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                     "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise bad(name, "must be a positive integer")
        for name in ("mem_len", "reuse_len"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise bad(name, "must be a non-negative integer or null")
        if self.position == "relative_xl" and (self.attention_kind != "softmax" or self.sliding_window is not None
                                               or self.disentangled_attention or self.num_kv_heads not in (None, self.num_heads)):
            raise bad("position", "relative_xl (Transformer-XL / XLNet) takes full softmax attention with one key "
                                  "head per query head: no attention_kind, sliding_window, disentangled_attention "
                                  "or num_kv_heads")
        for name in ("num_kv_heads", "head_dim", "embedding_size", "sliding_window"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise bad(name, "must be a positive integer or null")
        if self.type_vocab_size < 0:
            raise bad("type_vocab_size", "must be a non-negative integer")
        if self.num_languages < 0:
            raise bad("num_languages", "must be a non-negative integer (0 = no language embeddings)")
        if self.head_dim is None and self.hidden_size % self.num_heads:
            raise ConfigError(f"config: num_heads={self.num_heads} does not divide hidden_size={self.hidden_size}")
        if self.num_heads % self.kv_heads:
            raise ConfigError(f"config: num_kv_heads={self.kv_heads} does not divide num_heads={self.num_heads} "
                              "(each key/value head serves a whole group of query heads)")
        for name in ("dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise bad(name, "must be a probability in [0, 1)")
        for name in ("norm_eps", "rope_theta", "initializer_range"):
            if getattr(self, name) <= 0:
                raise bad(name, "must be a positive number")
        if self.attention_scale is not None and self.attention_scale <= 0:
            raise bad("attention_scale", "must be a positive number or null")
        if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.vocab_size:
            raise bad("pad_token_id", f"is outside the vocabulary (vocab_size={self.vocab_size})")
        for name in ("bos_token_id", "eos_token_id"):  # may lie outside (tiny test configs keep GPT-2's 50256)
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise bad(name, "must be a non-negative integer or null")
        if self.position == "relative_bias":
            if self.relative_num_buckets < 4:
                raise bad("relative_num_buckets", "must be at least 4 (half the buckets for each direction, "
                                                  "half of those exact)")
            if self.relative_max_distance <= self.relative_num_buckets // 2:
                raise bad("relative_max_distance", f"must exceed relative_num_buckets // 2 "
                                                   f"({self.relative_num_buckets // 2}): the exact buckets")
        if self.causal and self.tie_word_embeddings and self.emb_size != self.hidden_size:
            raise bad("embedding_size", f"must equal hidden_size={self.hidden_size} in a causal LM whose output "
                                        "projection is tied to the embeddings (or set tie_word_embeddings: false)")
        if self.position == "rope" and self.dim_head % 2:
            raise bad("head_dim", "must be even for RoPE (dimensions rotate in pairs)")
        if not 0.0 < self.rotary_fraction <= 1.0:
            raise bad("rotary_fraction", "must lie in (0, 1]")
        if self.position == "rope" and (self.rotary_dim % 2 or not self.rotary_dim):
            raise bad("rotary_fraction", f"gives {self.rotary_dim} rotated dimensions of head_dim={self.dim_head}; "
                                         "must be even (dimensions rotate in pairs)")
        if self.num_experts < 0 or self.num_experts == 1:
            raise bad("num_experts", "must be 0 (a dense FFN) or at least 2")
        if self.num_experts and not 1 <= self.experts_top_k <= self.num_experts:
            raise bad("experts_top_k", f"must lie in [1, num_experts={self.num_experts}]")
        for name in ("router_aux_loss_coef", "router_z_loss_coef"):
            if getattr(self, name) < 0:
                raise bad(name, "must be a non-negative number")
        if self.attention_kind == "linear" and (self.sliding_window is not None or self.position == "relative_bias"):
            raise bad("attention_kind", "cannot take a sliding_window or a relative position bias (its kernel "
                                        "has no score matrix to mask or bias)")
        if self.sparse_block_size <= 0 or self.num_random_blocks < 0:
            raise bad("sparse_block_size" if self.sparse_block_size <= 0 else "num_random_blocks",
                      "must be a positive (num_random_blocks: non-negative) integer")
        if self.attention_kind == "block_sparse" and (self.causal or self.sliding_window is not None
                                                      or self.global_attention or self.position == "relative_bias"):
            raise bad("attention_kind", "block_sparse (BigBird) is bidirectional with its own window and global "
                                        "blocks: it cannot take causal, sliding_window, global_attention or a "
                                        "relative position bias")
        if self.global_attention and self.kv_heads != self.num_heads:
            raise bad("global_attention", "needs num_kv_heads = num_heads (Longformer's global projections are per head)")
        if any(t not in ("c2p", "p2c") for t in self.disentangled_attention) or \
                len(set(self.disentangled_attention)) != len(self.disentangled_attention):
            raise bad("disentangled_attention", "must list each of 'c2p', 'p2c' at most once")
        if self.disentangled_attention and (self.causal or self.attention_kind != "softmax" or self.global_attention
                                            or self.kv_heads != self.num_heads):
            raise bad("disentangled_attention", "is for a bidirectional softmax encoder with one key head per query "
                                                "head (not causal, linear, global or GQA)")
        if self.position_buckets < 0:
            raise bad("position_buckets", "must be 0 (no buckets) or a positive integer")
        if self.position_buckets and self.position_buckets < 4:
            raise bad("position_buckets", "must be at least 4 (half exact distances, half log-spaced)")
        if self.max_relative_positions is not None and self.max_relative_positions <= 0:
            raise bad("max_relative_positions", "must be a positive integer or null (= max_position_embeddings)")
        reach = self.max_relative_positions or self.max_position_embeddings
        if self.position_buckets and reach <= self.position_buckets // 2 + 1:
            # the log buckets span position_buckets/2 .. max_relative_positions - 1 (log of a ratio > 1)
            raise bad("max_relative_positions", f"(or max_position_embeddings when null) must exceed "
                                                f"position_buckets // 2 + 1 = {self.position_buckets // 2 + 1}")
        if self.parallel_residual and self.norm_placement != "pre":
            raise bad("parallel_residual", "needs norm_placement='pre' (both sublayers read the block's input)")

    def _check_types(self) -> None:
        for f in dataclasses.fields(self):
            want = type_mismatch(getattr(self, f.name), f.type)
            if want:
                raise ConfigError(f"config: {f.name}={_show(getattr(self, f.name))} must be {want}")

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> "ModelConfig":
        """Build from a plain dict; an unknown key is an error that names it."""
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a mapping of field names to values, got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted((k for k in data if k not in names), key=str)
        if unknown:
            raise ConfigError(f"{source}: unknown key {unknown[0]!r}" + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else "")
                              + f"; known keys: {', '.join(sorted(names))}")
        try:
            return cls(**data)
        except ConfigError as err:
            raise ConfigError(f"{source}: {str(err).removeprefix('config: ')}") from None
        except TypeError as err:  # e.g. a list where a number belongs
            raise ConfigError(f"{source}: {err}") from None

    def replace(self, **changes: Any) -> "ModelConfig":
        return ModelConfig.from_dict({**self.to_dict(), **changes})

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")


# One line per field for the generated reference (docs site: ModelConfig fields); a test holds it complete.
FIELD_DOCS: dict[str, str] = {
    "model_type": "Checkpoint family (interop registry key): picks the Hugging Face config and state-dict tables.",
    "vocab_size": "Rows of the token embedding (and of a tied LM head).",
    "hidden_size": "Width d_model of every hidden state.",
    "num_layers": "Transformer blocks in the stack (per stack in an encoder-decoder).",
    "num_heads": "Query heads per attention layer.",
    "num_kv_heads": "Key/value heads: null = num_heads (MHA), 1 = MQA, in between = GQA.",
    "head_dim": "Size d_k of one head; null = hidden_size // num_heads.",
    "intermediate_size": "Inner width of the feed-forward layer (of each expert in a MoE).",
    "max_position_embeddings": "Longest sequence the position scheme covers (rows of a learned table).",
    "type_vocab_size": "Segment (token type) embeddings; 0 = none.",
    "embedding_size": "ALBERT's factorized embedding width E < H; null = hidden_size.",
    "num_languages": "XLM language embeddings added to each token, chosen by `langs`; 0 = none.",
    "position": "Position scheme: learned, sinusoidal, rope, relative_bias (T5), relative_xl (Transformer-XL) or none.",
    "norm": "Normalisation: layernorm or rmsnorm.",
    "norm_placement": "post: LN(x + f(x)) as BERT; pre: x + f(LN(x)) as GPT-2.",
    "activation": "Feed-forward activation: relu, gelu, gelu_tanh, silu, leaky_relu, or a GLU: geglu, swiglu, "
                  "geglu_tanh.",
    "bias": "Biases in linear layers and LayerNorm.",
    "causal": "Each token attends only to itself and earlier tokens (decoder).",
    "sliding_window": "Local attention: each query sees keys within this distance; null = all.",
    "attention_kind": "softmax, linear (elu+1 kernel, O(T)) or block_sparse (BigBird, O(T)).",
    "global_attention": "Longformer: tokens in global_attention_mask attend everywhere with their own Q/K/V.",
    "sparse_block_size": "block_sparse (BigBird): tokens per block.",
    "num_random_blocks": "block_sparse (BigBird): random key blocks per query block.",
    "attention_scale": "Score scale; null = 1/sqrt(head_dim) (T5 and GPT-Neo use 1.0).",
    "qkv_bias": "Biases on the Q/K/V projections; null = follow `bias`.",
    "rotary_fraction": "Share of each head's dimensions that RoPE rotates (GPT-NeoX: 0.25).",
    "parallel_residual": "x + attn(LN1 x) + ffn(LN2 x) in one step (GPT-J, GPT-NeoX).",
    "embedding_norm": "LayerNorm after the embeddings (BERT: yes, GPT-2: no).",
    "scale_embeddings": "Multiply token embeddings by sqrt(hidden_size) (original Transformer).",
    "final_norm": "A norm after the last block; null = yes for pre-LN stacks, no for post-LN.",
    "pooler": "BERT's tanh pooler over [CLS].",
    "classifier_pooling": "What a sequence classifier reads: cls (the pooled [CLS]) or mean (a masked mean of the "
                          "hidden states).",
    "tie_word_embeddings": "The LM head shares the token embedding matrix.",
    "share_layers": "ALBERT: one block's parameters reused by every layer.",
    "num_experts": "Mixture of experts: FFNs per layer behind a router; 0 = dense FFN.",
    "experts_top_k": "Experts each token is routed to.",
    "router_aux_loss_coef": "Weight of the load-balancing loss in training (Switch Transformer).",
    "router_z_loss_coef": "Weight of the router z-loss (ST-MoE); 0 = off.",
    "disentangled_attention": "DeBERTa: extra score terms, any of c2p and p2c; [] = off.",
    "position_buckets": "DeBERTa: log-bucketed relative distances beyond position_buckets/2; 0 = no buckets.",
    "max_relative_positions": "DeBERTa: largest relative distance told apart; null = max_position_embeddings.",
    "share_att_key": "DeBERTa v2: project the position table with the layer's own W_q/W_k.",
    "relative_embedding_norm": "DeBERTa v2: a LayerNorm on the relative position table.",
    "relative_segments": "XLNet: relative segment encodings read from token_type_ids.",
    "mem_len": "Transformer-XL: hidden states per layer returned as `mems` for the next segment; null = all.",
    "reuse_len": "Transformer-XL: tokens of the current segment that go into the mems; null = all.",
    "norm_eps": "Epsilon of every norm.",
    "dropout": "Hidden dropout (embeddings and sublayer outputs).",
    "attention_dropout": "Dropout on the attention probabilities.",
    "initializer_range": "Standard deviation of the normal weight initialisation.",
    "rope_theta": "RoPE base: frequencies theta^(-2i/d).",
    "relative_num_buckets": "T5 relative bias: distance buckets (split by direction when bidirectional; half "
                            "exact, half log-spaced).",
    "relative_max_distance": "T5 relative bias: distance where the last bucket starts.",
    "pad_token_id": "Padding token id; null = none.",
    "bos_token_id": "Beginning-of-sequence token id; null = none.",
    "eos_token_id": "End-of-sequence token id; generation stops on it; null = none.",
    "attn_implementation": "How attention runs, not what it computes: sdpa (fused), eager (explicit, returns the "
                           "weights) or tiled (FlashAttention's algorithm).",
    "extra": "Family-specific values kept so that a save writes them back.",
}


# Presets are data. The BERT sizes are the paper's (Devlin et al. 2019, §3): base L=12 H=768 A=12,
# large L=24 H=1024 A=16; the small ones follow Turc et al. 2019 ("Well-Read Students"), as google/bert.
_BERT = dict(model_type="bert")
_RNN = dict(model_type="rnn", vocab_size=8000, hidden_size=256, num_layers=1, num_heads=1, intermediate_size=256,
            max_position_embeddings=256, type_vocab_size=0, position="none", pooler=False, dropout=0.2,
            pad_token_id=0, eos_token_id=1, bos_token_id=2)
_RNN_EXTRA = {"cell": "gru", "decoder_start_token_id": 2, "warmup_steps": 1000, "adam_betas": [0.9, 0.999],
              "adam_eps": 1e-8}
# BART (Lewis et al. 2019, §2.1): the original post-LN encoder-decoder with GELU, a LayerNorm on the
# embeddings, fairseq's learned positions counted from 2 whatever the padding (hence 1024 + 2 rows),
# one byte-level BPE vocabulary shared by encoder, decoder and the tied output projection plus a
# (buffer) bias on the logits; decoding starts from </s> = 2. Sizes: base 6+6 x 768, large 12+12 x 1024.
_BART = dict(model_type="bart", vocab_size=50265, max_position_embeddings=1026, type_vocab_size=0, position="learned",
             norm_placement="post", activation="gelu", embedding_norm=True, scale_embeddings=False, pooler=False,
             norm_eps=1e-5, dropout=0.1, attention_dropout=0.1, pad_token_id=1, bos_token_id=0, eos_token_id=2)
_BART_EXTRA = dict(decoder_start_token_id=2, position_offset=2, pad_aware_positions=False, final_logits_bias=True)
# DeBERTa-v3 (He et al. 2023; sizes of the released checkpoints): BERT's post-LN encoder with disentangled
# attention (c2p + p2c, He et al. 2021 §3.1) over 2 x 256 log-bucketed relative positions up to 512, position
# keys through each layer's own W_q/W_k, a LayerNorm on the position table, no absolute positions in the input,
# 128k SentencePiece vocabulary; the classifier's pooler (GELU) belongs to the head.
_DEBERTA_V3 = dict(model_type="deberta-v2", vocab_size=128100, type_vocab_size=0, position="none", norm_eps=1e-7,
                   pooler=False, disentangled_attention=["p2c", "c2p"], position_buckets=256, share_att_key=True,
                   relative_embedding_norm=True, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                   extra={"head_pooler": True, "pooler_activation": "gelu"})
# XLNet (Yang et al. 2019; sizes of the released xlnet-base-cased): post-LN blocks with Transformer-XL relative
# attention (bias-free projections, u/v biases, relative sinusoids; nn/relative_xl.py), relative segment
# encodings, no absolute positions and no LayerNorm on the embeddings, 32k SentencePiece vocabulary;
# max_position_embeddings is unused (relative positions only). Two streams + mems at run time (PermutationLM).
_XLNET = dict(model_type="xlnet", vocab_size=32000, type_vocab_size=0, position="relative_xl", relative_segments=True,
              qkv_bias=False, embedding_norm=False, final_norm=False, pooler=False, norm_eps=1e-12, dropout=0.1,
              attention_dropout=0.1, pad_token_id=5, bos_token_id=1, eos_token_id=2)
PRESETS: dict[str, dict[str, Any]] = {
    "bert-base": dict(_BERT),
    "bert-large": dict(_BERT, hidden_size=1024, num_layers=24, num_heads=16, intermediate_size=4096),
    "bert-medium": dict(_BERT, hidden_size=512, num_layers=8, num_heads=8, intermediate_size=2048),
    "bert-small": dict(_BERT, hidden_size=512, num_layers=4, num_heads=8, intermediate_size=2048),
    "bert-mini": dict(_BERT, hidden_size=256, num_layers=4, num_heads=4, intermediate_size=1024),
    "bert-tiny": dict(_BERT, hidden_size=128, num_layers=2, num_heads=2, intermediate_size=512),
    "minilm-l6": dict(_BERT, hidden_size=384, num_layers=6, num_heads=12, intermediate_size=1536),
    # The BERT family after BERT, each a configuration of the same backbone; sizes from the papers.
    # RoBERTa (Liu et al. 2019): BERT-base shape, byte-level BPE vocab, no segments, positions from pad+1.
    "roberta-base": dict(model_type="roberta", vocab_size=50265, max_position_embeddings=514, type_vocab_size=1,
                         norm_eps=1e-5, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                         extra={"position_offset": 2}),
    # XLM-R base (Conneau et al. 2020, Table 7): RoBERTa-base with a 250k SentencePiece vocabulary, no
    # language embeddings (the language is told by the text alone).
    "xlm-roberta-base": dict(model_type="xlm-roberta", vocab_size=250002, max_position_embeddings=514,
                             type_vocab_size=1, norm_eps=1e-5, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                             extra={"position_offset": 2, "head_activation": "gelu"}),
    # XLM MLM en-fr (Lample & Conneau 2019, §5.1: 1024 units, 8 heads, 6 layers, GELU): post-LN, learned positions,
    # two language embeddings, a shared 64k BPE vocabulary, an LM head without transform (tied projection + bias).
    "xlm-mlm-enfr-1024": dict(model_type="xlm", vocab_size=64139, hidden_size=1024, num_layers=6, num_heads=8,
                              intermediate_size=4096, type_vocab_size=0, num_languages=2, pooler=False,
                              pad_token_id=2, bos_token_id=0, eos_token_id=1,
                              extra={"head_transform": False, "n_langs": 2}),
    # ALBERT-base (Lan et al. 2020, Table 1): E=128 factorized embeddings, all 12 layers share one block.
    "albert-base": dict(model_type="albert", vocab_size=30000, embedding_size=128, activation="gelu_tanh",
                        share_layers=True, dropout=0.0, attention_dropout=0.0),
    # DistilBERT (Sanh et al. 2019): BERT-base with half the layers, no segments, no pooler.
    "distilbert-base": dict(model_type="distilbert", num_layers=6, type_vocab_size=0, pooler=False),
    # ELECTRA-small discriminator (Clark et al. 2020, Appendix A): H=256, E=128, 12 layers, no pooler.
    "electra-small": dict(model_type="electra", hidden_size=256, num_heads=4, intermediate_size=1024,
                          embedding_size=128, pooler=False),
    # ModernBERT-base (Warner et al. 2024): pre-LN, bias-free, GeGLU, RoPE, global attention every 3rd
    # layer and ±64-token local attention in between, 8192-token context.
    "modernbert-base": dict(model_type="modernbert", vocab_size=50368, num_layers=22, intermediate_size=1152,
                            max_position_embeddings=8192, type_vocab_size=0, position="rope", rope_theta=160000.0,
                            norm_placement="pre", activation="geglu", bias=False, norm_eps=1e-5, dropout=0.0,
                            attention_dropout=0.0, pooler=False, sliding_window=65, pad_token_id=50283,
                            bos_token_id=50281, eos_token_id=50282,
                            extra={"global_every": 3, "local_rope_theta": 10000.0, "skip_first_attn_norm": True}),
    # Long-document encoders, RoBERTa-base shape. Longformer-base (Beltagy et al. 2020): a 512-token
    # window (256 each side) + global tokens with their own Q/K/V, 4,096 positions.
    "longformer-base": dict(model_type="longformer", vocab_size=50265, max_position_embeddings=4098, type_vocab_size=1,
                            norm_eps=1e-5, pad_token_id=1, bos_token_id=0, eos_token_id=2, sliding_window=257,
                            global_attention=True, extra={"position_offset": 2, "head_activation": "gelu"}),
    # BigBird-RoBERTa-base (Zaheer et al. 2020, App. E): block-sparse attention, blocks of 64, 3 random blocks.
    "bigbird-base": dict(model_type="big_bird", vocab_size=50358, max_position_embeddings=4096, activation="gelu_tanh",
                         attention_kind="block_sparse", sparse_block_size=64, num_random_blocks=3, pad_token_id=0,
                         bos_token_id=1, eos_token_id=2, extra={"sep_token_id": 66}),
    "xlnet-base-cased": dict(_XLNET),
    "xlnet-large-cased": dict(_XLNET, hidden_size=1024, num_layers=24, num_heads=16, intermediate_size=4096),
    "xlnet-tiny": dict(_XLNET, hidden_size=128, num_layers=2, num_heads=2, intermediate_size=512, mem_len=64),
    "deberta-v3-base": dict(_DEBERTA_V3),
    "deberta-v3-xsmall": dict(_DEBERTA_V3, hidden_size=384, num_heads=6, intermediate_size=1536),
    # Encoder-decoders, built by attnlab.models.seq2seq.Seq2SeqLM; num_decoder_layers in extra.
    # The original Transformer, base model (Vaswani et al. 2017, Table 3): post-LN, sinusoidal positions added
    # to embeddings scaled by sqrt(d_model) (§3.4-3.5), ReLU FFN (§3.3), residual dropout 0.1 (§5.4), one
    # shared source/target vocabulary tied to the output projection (§3.4); training recipe in extra:
    # label smoothing 0.1 (§5.4), Adam(0.9, 0.98, 1e-9) with lr = d^-0.5 * min(step^-0.5, step * warmup^-1.5) (§5.3).
    "transformer-base": dict(model_type="transformer", vocab_size=37000, hidden_size=512, num_layers=6, num_heads=8,
                             intermediate_size=2048, max_position_embeddings=1024, type_vocab_size=0,
                             position="sinusoidal", norm_placement="post", activation="relu", embedding_norm=False,
                             scale_embeddings=True, pooler=False, norm_eps=1e-6, dropout=0.1, attention_dropout=0.0,
                             pad_token_id=0, eos_token_id=1, bos_token_id=2,
                             extra={"num_decoder_layers": 6, "decoder_start_token_id": 2, "label_smoothing": 0.1,
                                    "warmup_steps": 4000, "adam_betas": [0.9, 0.98], "adam_eps": 1e-9}),
    # Before the Transformer (attnlab.models.rnn.RNNSeq2Seq): a bidirectional GRU encoder and a GRU decoder,
    # without attention (Sutskever et al. 2014: the source squeezed into one vector), with additive attention
    # (Bahdanau et al. 2015) or with Luong et al.'s (2015) "general" score. num_heads / intermediate_size unused.
    "rnn": dict(_RNN, extra={**_RNN_EXTRA, "attention": "none"}),
    "rnn-attention": dict(_RNN, extra={**_RNN_EXTRA, "attention": "additive"}),
    "rnn-luong": dict(_RNN, extra={**_RNN_EXTRA, "attention": "general"}),
    # T5-small (Raffel et al. 2020, §3.1): pre-LN RMSNorm without bias, no absolute positions but a relative
    # bias per bucket computed once per stack and shared by its layers (§2.1), unscaled q.k (attention_scale
    # 1.0: the 1/sqrt(d_k) is folded into the initialisation), ReLU FFN; decoding starts from <pad> = 0.
    "t5-small": dict(model_type="t5", vocab_size=32128, hidden_size=512, num_layers=6, num_heads=8, head_dim=64,
                     intermediate_size=2048, type_vocab_size=0, position="relative_bias", norm="rmsnorm",
                     norm_placement="pre", activation="relu", bias=False, attention_scale=1.0, embedding_norm=False,
                     pooler=False, norm_eps=1e-6, dropout=0.1, attention_dropout=0.1, pad_token_id=0, eos_token_id=1,
                     extra={"num_decoder_layers": 6, "decoder_start_token_id": 0, "scale_decoder_outputs": True}),
    # T5 v1.1-small: gated-GELU FFN (Shazeer 2020), untied output projection, decoder output not rescaled.
    "t5-v1_1-small": dict(model_type="t5", vocab_size=32128, hidden_size=512, num_layers=8, num_heads=6, head_dim=64,
                          intermediate_size=1024, type_vocab_size=0, position="relative_bias", norm="rmsnorm",
                          norm_placement="pre", activation="geglu_tanh", bias=False, attention_scale=1.0,
                          embedding_norm=False, pooler=False, norm_eps=1e-6, dropout=0.1, attention_dropout=0.1,
                          pad_token_id=0, eos_token_id=1, tie_word_embeddings=False,
                          extra={"num_decoder_layers": 8, "decoder_start_token_id": 0, "scale_decoder_outputs": False}),
    # More decoders, each the GPT-2 stack with a few switches. GPT-1 (Radford et al. 2018): post-LN,
    # no final LayerNorm, 512 positions, 40,478 BPE tokens.
    "gpt1": dict(model_type="openai-gpt", vocab_size=40478, causal=True, norm_placement="post", activation="gelu_tanh",
                 embedding_norm=False, final_norm=False, pooler=False, type_vocab_size=0, norm_eps=1e-5,
                 pad_token_id=None),
    # GPT-Neo 125M (Black et al. 2021): global and 256-token local attention alternate, scores not scaled by
    # 1/sqrt(d_k), Q/K/V without bias.
    "gpt-neo-125m": dict(model_type="gpt_neo", vocab_size=50257, max_position_embeddings=2048, causal=True,
                         norm_placement="pre", activation="gelu_tanh", embedding_norm=False, pooler=False,
                         type_vocab_size=0, norm_eps=1e-5, dropout=0.0, attention_dropout=0.0, pad_token_id=None,
                         attention_scale=1.0, qkv_bias=False, sliding_window=256, bos_token_id=50256,
                         eos_token_id=50256, extra={"global_every": 2}),
    # Pythia-160M (Biderman et al. 2023), a GPT-NeoX: RoPE on a quarter of each head, parallel attention + FFN
    # residual, untied output projection.
    "pythia-160m": dict(model_type="gpt_neox", vocab_size=50304, max_position_embeddings=2048, causal=True,
                        position="rope", norm_placement="pre", embedding_norm=False, pooler=False, type_vocab_size=0,
                        norm_eps=1e-5, dropout=0.0, attention_dropout=0.0, pad_token_id=None, rotary_fraction=0.25,
                        parallel_residual=True, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0),
    # CTRL (Keskar et al. 2019, §3): 48 pre-LN layers, d=1280, 8192-wide ReLU FFN, 256 positions of fixed
    # sinusoids (sines then cosines) added to embeddings scaled by sqrt(d); control codes are ordinary tokens.
    "ctrl": dict(model_type="ctrl", vocab_size=246534, hidden_size=1280, num_layers=48, num_heads=16,
                 intermediate_size=8192, max_position_embeddings=256, type_vocab_size=0, causal=True,
                 position="sinusoidal", scale_embeddings=True, norm_placement="pre", activation="relu",
                 embedding_norm=False, pooler=False, norm_eps=1e-6, attention_dropout=0.0, pad_token_id=None,
                 extra={"sinusoid_halves": True, "lm_head_bias": True}),
    # ByT5-small (Xue et al. 2022, Table 1 and §3.1): T5 v1.1 on UTF-8 bytes (vocabulary 384: 3 specials, 256
    # bytes, 125 sentinels; `attnlab.load_tokenizer("byte")`), parameters moved from the tiny embedding into a
    # wider FFN and a 3:1 deeper encoder than decoder (12 vs 4 layers).
    "byt5-small": dict(model_type="t5", vocab_size=384, hidden_size=1472, num_layers=12, num_heads=6, head_dim=64,
                       intermediate_size=3584, type_vocab_size=0, position="relative_bias", norm="rmsnorm",
                       norm_placement="pre", activation="geglu_tanh", bias=False, attention_scale=1.0,
                       embedding_norm=False, pooler=False, norm_eps=1e-6, dropout=0.1, attention_dropout=0.1,
                       pad_token_id=0, eos_token_id=1, tie_word_embeddings=False, max_position_embeddings=1024,
                       extra={"num_decoder_layers": 4, "decoder_start_token_id": 0, "scale_decoder_outputs": False}),
    # BART: see _BART above
    # M2M-100 418M (Fan et al. 2020, as facebook/m2m100_418M): pre-LN 12 + 12 x 1024, 16 heads, ReLU FFN 4096,
    # final LayerNorms, fairseq's sinusoids counted from 2 over real tokens (1024 + 2 rows), embeddings times
    # sqrt(d), one 128,112-token vocabulary with 100 language tokens shared by both stacks and the output.
    "m2m100_418M": dict(model_type="m2m_100", vocab_size=128112, hidden_size=1024, num_layers=12, num_heads=16,
                        intermediate_size=4096, max_position_embeddings=1026, type_vocab_size=0, position="sinusoidal",
                        norm_placement="pre", final_norm=True, activation="relu", embedding_norm=False,
                        scale_embeddings=True, pooler=False, norm_eps=1e-5, dropout=0.1, attention_dropout=0.1,
                        pad_token_id=1, bos_token_id=0, eos_token_id=2,
                        extra={"num_decoder_layers": 12, "decoder_start_token_id": 2, "position_offset": 2,
                               "sinusoid_fairseq": True}),
    "bart-base": dict(_BART, hidden_size=768, num_layers=6, num_heads=12, intermediate_size=3072,
                      extra=dict(_BART_EXTRA, num_decoder_layers=6)),
    "bart-large": dict(_BART, hidden_size=1024, num_layers=12, num_heads=16, intermediate_size=4096,
                       attention_dropout=0.0, extra=dict(_BART_EXTRA, num_decoder_layers=12)),
    # Mistral 7B (Jiang et al. 2023, Table 1): LLaMA-style, GQA 32/8, 4096-token sliding window in every layer.
    "mistral-7b": dict(model_type="mistral", vocab_size=32000, hidden_size=4096, num_layers=32, num_heads=32,
                       num_kv_heads=8, intermediate_size=14336, max_position_embeddings=32768, type_vocab_size=0,
                       causal=True, position="rope", norm="rmsnorm", norm_placement="pre", activation="swiglu",
                       bias=False, embedding_norm=False, final_norm=True, pooler=False, norm_eps=1e-5, dropout=0.0,
                       attention_dropout=0.0, sliding_window=4096, tie_word_embeddings=False, pad_token_id=None,
                       bos_token_id=1, eos_token_id=2),
    # Mixtral 8x7B (Jiang et al. 2024, §2): Mistral's shape, full attention, 8 SwiGLU experts per layer, top-2:
    # 46.7B parameters, 12.9B active per token (`attnlab info mixtral-8x7b`).
    "mixtral-8x7b": dict(model_type="mixtral", vocab_size=32000, hidden_size=4096, num_layers=32, num_heads=32,
                         num_kv_heads=8, intermediate_size=14336, max_position_embeddings=32768, type_vocab_size=0,
                         causal=True, position="rope", norm="rmsnorm", norm_placement="pre", activation="swiglu",
                         bias=False, embedding_norm=False, final_norm=True, pooler=False, norm_eps=1e-5, dropout=0.0,
                         attention_dropout=0.0, rope_theta=1e6, tie_word_embeddings=False, pad_token_id=None,
                         bos_token_id=1, eos_token_id=2, num_experts=8, experts_top_k=2,
                         router_aux_loss_coef=0.02),
}


def preset(name: str, **overrides: Any) -> ModelConfig:
    """A named config, optionally with some fields changed: `preset("bert-mini", num_layers=2)`."""
    if not isinstance(name, str) or name not in PRESETS:
        raise ConfigError(f"unknown preset {_show(name)}; presets: {', '.join(sorted(PRESETS))}")
    # deep copy: a preset's `extra` dict must not be shared with (and mutated through) the configs built from it
    return ModelConfig.from_dict({**copy.deepcopy(PRESETS[name]), **overrides}, source=f"preset {name}")
