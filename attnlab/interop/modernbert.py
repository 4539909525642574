"""ModernBERT (Warner et al. 2024) in the Hugging Face layout: ModernBertModel / ModernBertForMaskedLM.

ModernBERT is an encoder with the decoder-era switches turned on (§2.1), each a field of ModelConfig:
pre-LN blocks with a final norm, no biases (linears and LayerNorms), GeGLU feed-forward, RoPE instead of
a position table, and attention that alternates: every third layer (0, 3, 6, ...) is global, the others
see a local window of 128 tokens, i.e. ±64 around the query (§2.1). Global layers rotate with
theta 160k, local ones with 10k. It runs unpadded (our default) and is trained at 8192 tokens.

Two details of the checkpoint layout:
- `Wqkv` holds Q, K, V fused and `mlp.Wi` holds the GeGLU's activated half then its linear half, both
  concatenated along the output dimension (tuple rows split them);
- the first block has no attention norm (the embeddings already end in a LayerNorm):
  `extra["skip_first_attn_norm"]`.
Window semantics: HF's `local_attention=128` lets a query see keys at |q - k| <= 64; our `sliding_window`
counts |q - k| < window, so sliding_window = local_attention // 2 + 1.
"""
from __future__ import annotations

from ..config import ConfigError, ModelConfig
from .registry import Family, Row, config_from_mapping, register

_RENAMES = {
    "vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_heads", "intermediate_size": "intermediate_size",
    "max_position_embeddings": "max_position_embeddings", "norm_eps": "norm_eps",
    "attention_dropout": "attention_dropout", "mlp_dropout": "dropout", "initializer_range": "initializer_range",
    "pad_token_id": "pad_token_id", "bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id",
}
_ACTIVATIONS = {"gelu": "geglu", "silu": "swiglu", "swish": "swiglu"}  # HF names the GLU's activation
OURS_ONLY = ("global_every", "local_rope_theta", "skip_first_attn_norm", "head_activation")


def _layer_pattern(hf: dict, source: str) -> int:
    """Every how many layers a global one comes; HF's own layout: global at 0, every, 2*every, ..."""
    n = hf.get("num_hidden_layers", 22)
    types = hf.get("layer_types")
    if not types:
        return int(hf.get("global_attn_every_n_layers", 3))
    if len(types) != n:
        raise ConfigError(f"{source}: layer_types has {len(types)} entries for num_hidden_layers={n}")
    globals_ = [i for i, t in enumerate(types) if t == "full_attention"]
    every = globals_[1] - globals_[0] if len(globals_) > 1 else n
    expected = ["sliding_attention" if i % every else "full_attention" for i in range(n)]
    if not globals_ or globals_[0] != 0 or types != expected:
        raise ConfigError(f"{source}: layer_types {types} is not a global layer every k layers starting at 0")
    return every


def _thetas(hf: dict) -> tuple[float, float]:
    rope = hf.get("rope_parameters") or {}
    glob = (rope.get("full_attention") or {}).get("rope_theta", hf.get("global_rope_theta", 160000.0))
    loc = (rope.get("sliding_attention") or {}).get("rope_theta", hf.get("local_rope_theta", 10000.0))
    for part in rope.values():
        if (part or {}).get("rope_type", "default") != "default":
            raise ConfigError(f"config.json: rope_type={part['rope_type']!r} is not supported (only 'default')")
    return float(glob), float(loc)


def modernbert_config_from_hf(hf: dict, source: str = "config.json") -> ModelConfig:
    biases = {k: hf.get(k, False) for k in ("attention_bias", "mlp_bias", "norm_bias", "classifier_bias")}
    if len(set(biases.values())) != 1:
        raise ConfigError(f"{source}: mixed bias settings {biases} are not supported (all on or all off)")
    if not hf.get("decoder_bias", True):
        raise ConfigError(f"{source}: decoder_bias=false is not supported")
    act = hf.get("hidden_activation", "gelu")
    if act not in _ACTIVATIONS:
        raise ConfigError(f"{source}: hidden_activation={act!r} is not supported; supported: {', '.join(_ACTIVATIONS)}")
    every = _layer_pattern(hf, source)
    global_theta, local_theta = _thetas(hf)
    local = int(hf.get("local_attention", 128))
    fixed = dict(model_type="modernbert", position="rope", norm="layernorm", norm_placement="pre",
                 activation=_ACTIVATIONS[act], bias=next(iter(biases.values())), type_vocab_size=0,
                 pooler=False, embedding_norm=True, final_norm=True, rope_theta=global_theta,
                 sliding_window=local // 2 + 1, tie_word_embeddings=hf.get("tie_word_embeddings", True))
    cfg = config_from_mapping(hf, source, _RENAMES, fixed,
                              set(biases) | {"decoder_bias", "hidden_activation", "layer_types", "rope_parameters",
                                             "global_attn_every_n_layers", "global_rope_theta", "local_rope_theta",
                                             "local_attention", "tie_word_embeddings", "rope_scaling"})
    cfg.extra.update(global_every=every, local_rope_theta=local_theta, skip_first_attn_norm=True,
                     head_activation=_hf_act_to_ours(hf.get("classifier_activation", "gelu"), source))
    return cfg


def _hf_act_to_ours(name: str, source: str) -> str:
    table = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "silu": "silu",
             "relu": "relu"}
    if name not in table:
        raise ConfigError(f"{source}: classifier_activation={name!r} is not supported")
    return table[name]


def modernbert_config_to_hf(cfg: ModelConfig) -> dict:
    act = {v: k for k, v in _ACTIVATIONS.items() if k != "swish"}.get(cfg.activation)
    if act is None or cfg.norm_placement != "pre" or cfg.position != "rope" or not cfg.sliding_window:
        raise ConfigError(f"config: ModernBERT needs pre-LN, RoPE, a GLU activation and a sliding window "
                          f"(got norm_placement={cfg.norm_placement!r}, position={cfg.position!r}, "
                          f"activation={cfg.activation!r}, sliding_window={cfg.sliding_window})")
    every = int(cfg.extra.get("global_every") or cfg.num_layers)
    out = {k: v for k, v in cfg.extra.items() if k not in OURS_ONLY}
    out.update({theirs: getattr(cfg, ours) for theirs, ours in _RENAMES.items()})
    head_act = {"gelu_tanh": "gelu_pytorch_tanh"}.get(cfg.extra.get("head_activation", "gelu"),
                                                      cfg.extra.get("head_activation", "gelu"))
    out.update(model_type="modernbert", hidden_activation=act, classifier_activation=head_act,
               attention_bias=cfg.bias, mlp_bias=cfg.bias, norm_bias=cfg.bias, classifier_bias=cfg.bias,
               decoder_bias=True, local_attention=2 * (cfg.sliding_window - 1),
               layer_types=["sliding_attention" if i % every else "full_attention" for i in range(cfg.num_layers)],
               rope_parameters={
                   "full_attention": {"rope_type": "default", "rope_theta": cfg.rope_theta},
                   "sliding_attention": {"rope_type": "default",
                                         "rope_theta": cfg.extra.get("local_rope_theta", cfg.rope_theta)}},
               tie_word_embeddings=cfg.tie_word_embeddings)
    return out


MODERNBERT_BACKBONE: list[Row] = [
    ("embeddings.tok", "embeddings.tok_embeddings"),
    ("embeddings.norm", "embeddings.norm"),
    ("layers.{i}.attn_norm", "layers.{i}.attn_norm"),  # absent for layer 0
    (("layers.{i}.attn.q", "layers.{i}.attn.k", "layers.{i}.attn.v"), "layers.{i}.attn.Wqkv"),
    ("layers.{i}.attn.o", "layers.{i}.attn.Wo"),
    ("layers.{i}.ffn_norm", "layers.{i}.mlp_norm"),
    # GeGLU: Wi's first half is activated (our gate), its second half multiplies it (our up)
    (("layers.{i}.ffn.gate", "layers.{i}.ffn.up"), "layers.{i}.mlp.Wi"),
    ("layers.{i}.ffn.down", "layers.{i}.mlp.Wo"),
    ("final_norm", "final_norm"),
]
MODERNBERT_MLM: list[Row] = [
    ("mlm.dense", "head.dense"),
    ("mlm.norm", "head.norm"),
    ("mlm.bias", "decoder.bias"),  # before the decoder row, which would otherwise claim it
    ("mlm.decoder", "decoder"),
]


def _family() -> Family:
    from ..heads import MaskedLM
    from ..models.encoder import Encoder
    return Family(
        model_type="modernbert", config_from_hf=modernbert_config_from_hf, config_to_hf=modernbert_config_to_hf,
        backbone_rows=MODERNBERT_BACKBONE, backbone_prefix="model.",
        architectures={"ModernBertModel": (Encoder, []), "ModernBertForMaskedLM": (MaskedLM, MODERNBERT_MLM)},
        default_architecture="ModernBertModel")


register(_family())
