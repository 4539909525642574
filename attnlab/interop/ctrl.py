"""CTRL (Keskar et al. 2019, "CTRL: A Conditional Transformer Language Model for Controllable Generation") in
the Hugging Face layout: CTRLModel / CTRLLMHeadModel.

A pre-LN causal decoder with the original Transformer's inputs: token embeddings times sqrt(d_model) plus
fixed sinusoids (§3; its table puts all sines before all cosines: `extra.sinusoid_halves`), ReLU FFN,
final LayerNorm, and an output projection tied to the embeddings but with a bias of its own
(`extra.lm_head_bias`). Control codes are ordinary tokens placed first in a sequence; nothing in the
architecture marks them (§2.1).
"""
from __future__ import annotations

from ..config import ConfigError, ModelConfig
from .registry import Family, Row, config_from_mapping, register

_RENAMES = {
    "vocab_size": "vocab_size", "n_embd": "hidden_size", "n_layer": "num_layers", "n_head": "num_heads",
    "dff": "intermediate_size", "n_positions": "max_position_embeddings", "layer_norm_epsilon": "norm_eps",
    "resid_pdrop": "dropout", "initializer_range": "initializer_range",
    "bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id", "pad_token_id": "pad_token_id",
}
_BLOCK_EPS = 1e-6  # transformers' CTRL blocks fix their LayerNorm eps; only the final norm reads the config


def ctrl_config_from_hf(hf: dict, source: str = "config.json") -> ModelConfig:
    eps = hf.get("layer_norm_epsilon", _BLOCK_EPS)
    if eps != _BLOCK_EPS:
        raise ConfigError(f"{source}: layer_norm_epsilon={eps!r} is not supported (CTRL's blocks use 1e-6 whatever "
                          "the config says; attnlab has one eps for every norm)")
    fixed = dict(model_type="ctrl", causal=True, position="sinusoidal", scale_embeddings=True, norm="layernorm",
                 norm_placement="pre", activation="relu", embedding_norm=False, final_norm=True, pooler=False,
                 type_vocab_size=0, bias=True, pad_token_id=None, norm_eps=_BLOCK_EPS, attention_dropout=0.0,
                 vocab_size=246534, hidden_size=1280, num_layers=48, num_heads=16, intermediate_size=8192,
                 max_position_embeddings=256, tie_word_embeddings=hf.get("tie_word_embeddings", True))
    cfg = config_from_mapping(hf, source, _RENAMES, fixed, {"tie_word_embeddings", "embd_pdrop", "use_cache"})
    return cfg.replace(extra={**cfg.extra, "sinusoid_halves": True, "lm_head_bias": True})


def ctrl_config_to_hf(cfg: ModelConfig) -> dict:
    if cfg.activation != "relu" or not cfg.extra.get("sinusoid_halves") or not cfg.extra.get("lm_head_bias"):
        raise ConfigError("config: a CTRL checkpoint needs activation='relu', extra.sinusoid_halves and "
                          "extra.lm_head_bias")
    out = {k: v for k, v in cfg.extra.items() if k not in ("sinusoid_halves", "lm_head_bias")}
    out.update({theirs: getattr(cfg, ours) for theirs, ours in _RENAMES.items()})
    out.update(model_type="ctrl", embd_pdrop=cfg.dropout, tie_word_embeddings=cfg.tie_word_embeddings)
    return out


CTRL_BACKBONE: list[Row] = [
    ("embeddings.tok", "w"),
    ("layers.{i}.attn_norm", "h.{i}.layernorm1"),
    ("layers.{i}.attn.q", "h.{i}.multi_head_attention.Wq"),
    ("layers.{i}.attn.k", "h.{i}.multi_head_attention.Wk"),
    ("layers.{i}.attn.v", "h.{i}.multi_head_attention.Wv"),
    ("layers.{i}.attn.o", "h.{i}.multi_head_attention.dense"),
    ("layers.{i}.ffn_norm", "h.{i}.layernorm2"),
    ("layers.{i}.ffn.up", "h.{i}.ffn.0"),
    ("layers.{i}.ffn.down", "h.{i}.ffn.2"),
    ("final_norm", "layernorm"),
]
CTRL_LM_HEAD: list[Row] = [("lm_head", "lm_head")]


def _family() -> Family:
    from ..models.decoder import CausalLM
    from ..models.encoder import Encoder
    return Family(
        model_type="ctrl", config_from_hf=ctrl_config_from_hf, config_to_hf=ctrl_config_to_hf,
        backbone_rows=CTRL_BACKBONE, backbone_prefix="transformer.",
        architectures={"CTRLModel": (Encoder, []), "CTRLLMHeadModel": (CausalLM, CTRL_LM_HEAD)},
        default_architecture="CTRLLMHeadModel", ignore=("pos_encoding",))


register(_family())
