"""DistilBERT (Sanh et al. 2019) in the Hugging Face layout: DistilBertModel / DistilBertForMaskedLM.

DistilBERT is BERT with half the layers (§2: "the number of layers is reduced by a factor of 2"), no
token-type embeddings and no pooler, trained by distillation (attnlab.objectives.distill). Its
checkpoints use their own names (`transformer.layer.{i}.attention.q_lin`, `sa_layer_norm`, ...) and
config keys (`dim`, `n_layers`, `hidden_dim`); LayerNorm eps is fixed at 1e-12.
"""
from __future__ import annotations

from ..config import ConfigError, ModelConfig
from .registry import Family, Row, config_from_mapping, hf_activation, register

_RENAMES = {
    "vocab_size": "vocab_size", "dim": "hidden_size", "n_layers": "num_layers", "n_heads": "num_heads",
    "hidden_dim": "intermediate_size", "max_position_embeddings": "max_position_embeddings",
    "dropout": "dropout", "attention_dropout": "attention_dropout", "initializer_range": "initializer_range",
    "pad_token_id": "pad_token_id",
}


def distilbert_config_from_hf(hf: dict, source: str = "config.json") -> ModelConfig:
    # sinusoidal_pos_embds only changes how the position table is initialised; the table is stored
    # in the checkpoint either way, so the model reads it as a learned one (the flag stays in extra)
    fixed = dict(model_type="distilbert", activation=hf_activation(hf.get("activation", "gelu"), source),
                 type_vocab_size=0, pooler=False, norm_eps=1e-12,
                 tie_word_embeddings=hf.get("tie_word_embeddings", True))
    return config_from_mapping(hf, source, _RENAMES, fixed, {"activation", "tie_word_embeddings"})


def distilbert_config_to_hf(cfg: ModelConfig) -> dict:
    act = {"gelu": "gelu", "relu": "relu", "gelu_tanh": "gelu_new", "silu": "silu"}.get(cfg.activation)
    if act is None or cfg.type_vocab_size or cfg.norm_eps != 1e-12 or cfg.norm_placement != "post":
        raise ConfigError("config: DistilBERT has post-LN blocks with GELU/ReLU, no token types and "
                          f"LayerNorm eps 1e-12 (got activation={cfg.activation!r}, "
                          f"type_vocab_size={cfg.type_vocab_size}, norm_eps={cfg.norm_eps})")
    out = dict(cfg.extra)
    out.update({theirs: getattr(cfg, ours) for theirs, ours in _RENAMES.items()})
    out.update(model_type="distilbert", activation=act, tie_word_embeddings=cfg.tie_word_embeddings)
    return out


DISTILBERT_BACKBONE: list[Row] = [
    ("embeddings.tok", "embeddings.word_embeddings"),
    ("embeddings.pos", "embeddings.position_embeddings"),
    ("embeddings.norm", "embeddings.LayerNorm"),
    ("layers.{i}.attn.q", "transformer.layer.{i}.attention.q_lin"),
    ("layers.{i}.attn.k", "transformer.layer.{i}.attention.k_lin"),
    ("layers.{i}.attn.v", "transformer.layer.{i}.attention.v_lin"),
    ("layers.{i}.attn.o", "transformer.layer.{i}.attention.out_lin"),
    ("layers.{i}.attn_norm", "transformer.layer.{i}.sa_layer_norm"),
    ("layers.{i}.ffn.up", "transformer.layer.{i}.ffn.lin1"),
    ("layers.{i}.ffn.down", "transformer.layer.{i}.ffn.lin2"),
    ("layers.{i}.ffn_norm", "transformer.layer.{i}.output_layer_norm"),
]
DISTILBERT_MLM: list[Row] = [
    ("mlm.dense", "vocab_transform"),
    ("mlm.norm", "vocab_layer_norm"),
    ("mlm.bias", "vocab_projector.bias"),  # before the decoder row: HF keeps the bias inside the projector
    ("mlm.decoder", "vocab_projector"),
]


def _family() -> Family:
    from ..heads import MaskedLM
    from ..models.encoder import Encoder
    return Family(
        model_type="distilbert", config_from_hf=distilbert_config_from_hf, config_to_hf=distilbert_config_to_hf,
        backbone_rows=DISTILBERT_BACKBONE, backbone_prefix="distilbert.",
        architectures={"DistilBertModel": (Encoder, []), "DistilBertForMaskedLM": (MaskedLM, DISTILBERT_MLM)},
        default_architecture="DistilBertModel",
        ignore=("embeddings.position_ids",))


register(_family())
