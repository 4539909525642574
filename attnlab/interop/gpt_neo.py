"""GPT-Neo (Black et al. 2021, EleutherAI) in the Hugging Face layout: GPTNeoModel / GPTNeoForCausalLM.

GPT-2's block (pre-LN, learned positions, GELU-tanh, tied output) with two differences, both switches:
layers alternate global and local attention (a local layer sees the previous `window_size` tokens:
`sliding_window` + `extra.global_every=2`, the first layer global), and the scores are not divided by
sqrt(d_k) (`attention_scale=1.0`, as in Mesh-TensorFlow). Q/K/V have no bias, the output projection has one
(`qkv_bias=False`).
"""
from __future__ import annotations

from ..config import ConfigError, ModelConfig
from .registry import Family, Row, config_from_mapping, register

_RENAMES = {
    "vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_layers": "num_layers", "num_heads": "num_heads",
    "max_position_embeddings": "max_position_embeddings", "layer_norm_epsilon": "norm_eps",
    "resid_dropout": "dropout", "attention_dropout": "attention_dropout", "initializer_range": "initializer_range",
    "bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id", "pad_token_id": "pad_token_id",
}
_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}


def attention_layers(hf: dict, num_layers: int, source: str) -> list[str]:
    """GPT-Neo's `attention_types`, [[["global", "local"], 12]], expanded to one kind per layer."""
    types = hf.get("attention_types") or [[["global", "local"], num_layers // 2]]
    try:
        layers = [kind for pattern, repeat in types for _ in range(repeat) for kind in pattern]
    except (TypeError, ValueError):
        raise ConfigError(f"{source}: attention_types={types!r} is not a list of [[kinds...], repeat]") from None
    if len(layers) != num_layers or set(layers) - {"global", "local"}:
        raise ConfigError(f"{source}: attention_types={types!r} must give 'global'/'local' for each of the "
                          f"{num_layers} layers, got {len(layers)}")
    return layers


def gpt_neo_config_from_hf(hf: dict, source: str = "config.json") -> ModelConfig:
    act = hf.get("activation_function", "gelu_new")
    if act not in _ACTIVATIONS:
        raise ConfigError(f"{source}: activation_function={act!r} is not supported; "
                          f"supported: {', '.join(_ACTIVATIONS)}")
    hidden, num_layers = hf.get("hidden_size", 2048), hf.get("num_layers", 24)
    layers = attention_layers(hf, num_layers, source)
    window, extra = None, {}
    if "local" in layers:
        window = hf.get("window_size", 256)
        # which layers are local is expressed as "every k-th layer (from 0) is global" (Encoder._is_local)
        every = None if "global" not in layers else next(
            (k for k in range(2, num_layers + 1)
             if layers == ["global" if i % k == 0 else "local" for i in range(num_layers)]), 0)
        if every == 0:
            raise ConfigError(f"{source}: attention_types={hf.get('attention_types')!r}: only all-global, all-local "
                              "or a global layer every k layers from layer 0 (GPT-Neo's pattern) are supported")
        extra = {"global_every": every} if every else {}
    fixed = dict(model_type="gpt_neo", causal=True, position="learned", norm="layernorm", norm_placement="pre",
                 activation=_ACTIVATIONS[act], embedding_norm=False, final_norm=True, pooler=False,
                 type_vocab_size=0, bias=True, qkv_bias=False, attention_scale=1.0, sliding_window=window,
                 pad_token_id=None, norm_eps=1e-5, dropout=0.0, attention_dropout=0.0, hidden_size=hidden,
                 num_layers=num_layers, num_heads=16, max_position_embeddings=2048, vocab_size=50257,
                 intermediate_size=hf.get("intermediate_size") or 4 * hidden,
                 tie_word_embeddings=hf.get("tie_word_embeddings", True))
    cfg = config_from_mapping(hf, source, _RENAMES, fixed, {
        "activation_function", "intermediate_size", "tie_word_embeddings", "attention_types", "attention_layers",
        "window_size", "embed_dropout"})
    return cfg.replace(extra={**cfg.extra, **extra}) if extra else cfg


def gpt_neo_config_to_hf(cfg: ModelConfig) -> dict:
    act = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}.get(cfg.activation)
    if act is None:
        raise ConfigError(f"config: activation={cfg.activation!r} has no GPT-Neo equivalent")
    out = {k: v for k, v in cfg.extra.items() if k != "global_every"}
    out.update({theirs: getattr(cfg, ours) for theirs, ours in _RENAMES.items()})
    every = cfg.extra.get("global_every") if cfg.sliding_window else 1
    if cfg.sliding_window and not every:  # every layer local
        types = [[["local"], cfg.num_layers]]
    elif every == 1:
        types = [[["global"], cfg.num_layers]]
    elif cfg.num_layers % every == 0:
        types = [[["global"] + ["local"] * (every - 1), cfg.num_layers // every]]
    else:
        kinds = ["global" if i % every == 0 else "local" for i in range(cfg.num_layers)]
        types = [[[k], 1] for k in kinds]
    out.update(model_type="gpt_neo", activation_function=act, intermediate_size=cfg.intermediate_size,
               attention_types=types, window_size=cfg.sliding_window or 256, embed_dropout=cfg.dropout,
               tie_word_embeddings=cfg.tie_word_embeddings)
    return out


GPT_NEO_BACKBONE: list[Row] = [
    ("embeddings.tok", "wte"),
    ("embeddings.pos", "wpe"),
    ("layers.{i}.attn_norm", "h.{i}.ln_1"),
    ("layers.{i}.attn.q", "h.{i}.attn.attention.q_proj"),
    ("layers.{i}.attn.k", "h.{i}.attn.attention.k_proj"),
    ("layers.{i}.attn.v", "h.{i}.attn.attention.v_proj"),
    ("layers.{i}.attn.o", "h.{i}.attn.attention.out_proj"),
    ("layers.{i}.ffn_norm", "h.{i}.ln_2"),
    ("layers.{i}.ffn.up", "h.{i}.mlp.c_fc"),
    ("layers.{i}.ffn.down", "h.{i}.mlp.c_proj"),
    ("final_norm", "ln_f"),
]
GPT_NEO_LM_HEAD: list[Row] = [("lm_head", "lm_head")]


def _family() -> Family:
    from ..models.decoder import CausalLM
    from ..models.encoder import Encoder
    return Family(
        model_type="gpt_neo", config_from_hf=gpt_neo_config_from_hf, config_to_hf=gpt_neo_config_to_hf,
        backbone_rows=GPT_NEO_BACKBONE, backbone_prefix="transformer.",
        architectures={"GPTNeoModel": (Encoder, []), "GPTNeoForCausalLM": (CausalLM, GPT_NEO_LM_HEAD)},
        default_architecture="GPTNeoForCausalLM",
        # old checkpoints carry each layer's (local) causal mask as a buffer
        ignore=tuple(f"h.{i}.attn.attention.{b}" for i in range(128) for b in ("bias", "masked_bias")))


register(_family())
