"""ALBERT (Lan et al. 2020) in the Hugging Face layout: AlbertModel / AlbertForMaskedLM /
AlbertForPreTraining.

ALBERT is BERT with two parameter-reduction switches (§3.1) and one objective change (§3.2):
- factorized embeddings: tokens are embedded in E dimensions (E << H) and projected up by one linear layer
  (`embedding_size`; our `embeddings.project` is HF's `encoder.embedding_hidden_mapping_in`);
- cross-layer sharing: one block's parameters serve all layers (`share_layers`; HF keeps the block once,
  in `albert_layer_groups.0.albert_layers.0`);
- sentence-order prediction instead of NSP: the same 2-way head on the pooled vector, trained on swapped
  segment pairs (the head is `NSPHead`; the pairs come from the objectives).
Only the published layout (one group holding one layer) is supported: num_hidden_groups = inner_group_num = 1.
"""
from __future__ import annotations

from ..config import ConfigError, ModelConfig
from .bert import BERT_RENAMES
from .registry import Family, Row, config_from_mapping, hf_activation, register

_RENAMES = dict(BERT_RENAMES, embedding_size="embedding_size")
_ACT_BACK = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}


def albert_config_from_hf(hf: dict, source: str = "config.json") -> ModelConfig:
    for key in ("num_hidden_groups", "inner_group_num"):
        if hf.get(key, 1) != 1:
            raise ConfigError(f"{source}: {key}={hf[key]!r} is not supported (only the published layout: "
                              "one group of one shared layer)")
    pos = hf.get("position_embedding_type", "absolute")
    if pos != "absolute":
        raise ConfigError(f"{source}: position_embedding_type={pos!r} is not supported (only 'absolute')")
    fixed = dict(model_type="albert", activation=hf_activation(hf.get("hidden_act", "gelu_new"), source),
                 share_layers=True, embedding_size=hf.get("embedding_size", 128),
                 tie_word_embeddings=hf.get("tie_word_embeddings", True),
                 bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"))
    return config_from_mapping(hf, source, _RENAMES, fixed,
                               {"hidden_act", "position_embedding_type", "tie_word_embeddings",
                                "num_hidden_groups", "inner_group_num", "bos_token_id", "eos_token_id"})


def albert_config_to_hf(cfg: ModelConfig) -> dict:
    if not cfg.share_layers:
        raise ConfigError("config: share_layers=False has no ALBERT equivalent (ALBERT shares one block)")
    if cfg.activation not in _ACT_BACK:
        raise ConfigError(f"config: activation={cfg.activation!r} has no ALBERT equivalent")
    out = dict(cfg.extra)
    out.update({theirs: getattr(cfg, ours) for theirs, ours in _RENAMES.items()})
    out.update(model_type="albert", hidden_act=_ACT_BACK[cfg.activation], embedding_size=cfg.emb_size,
               num_hidden_groups=1, inner_group_num=1, position_embedding_type="absolute",
               tie_word_embeddings=cfg.tie_word_embeddings, bos_token_id=cfg.bos_token_id,
               eos_token_id=cfg.eos_token_id)
    return out


_L = "encoder.albert_layer_groups.0.albert_layers.0."  # the one shared block
ALBERT_BACKBONE: list[Row] = [
    ("embeddings.tok", "embeddings.word_embeddings"),
    ("embeddings.pos", "embeddings.position_embeddings"),
    ("embeddings.seg", "embeddings.token_type_embeddings"),
    ("embeddings.norm", "embeddings.LayerNorm"),
    ("embeddings.project", "encoder.embedding_hidden_mapping_in"),
    # layers.1 ... layers.N-1 are the same tensors as layers.0 and are never written (tied keys)
    ("layers.0.attn.q", _L + "attention.query"),
    ("layers.0.attn.k", _L + "attention.key"),
    ("layers.0.attn.v", _L + "attention.value"),
    ("layers.0.attn.o", _L + "attention.dense"),
    ("layers.0.attn_norm", _L + "attention.LayerNorm"),
    ("layers.0.ffn.up", _L + "ffn"),
    ("layers.0.ffn.down", _L + "ffn_output"),
    ("layers.0.ffn_norm", _L + "full_layer_layer_norm"),
    ("pooler.dense", "pooler"),
]
ALBERT_MLM: list[Row] = [
    ("mlm.dense", "predictions.dense"),
    ("mlm.norm", "predictions.LayerNorm"),
    ("mlm.bias", "predictions.bias"),
    ("mlm.decoder", "predictions.decoder"),
]
ALBERT_SOP: list[Row] = [("nsp.linear", "sop_classifier.classifier")]


def _family() -> Family:
    from ..heads import MaskedLM, PreTraining
    from ..models.encoder import Encoder
    return Family(
        model_type="albert", config_from_hf=albert_config_from_hf, config_to_hf=albert_config_to_hf,
        backbone_rows=ALBERT_BACKBONE, backbone_prefix="albert.",
        architectures={"AlbertModel": (Encoder, []), "AlbertForMaskedLM": (MaskedLM, ALBERT_MLM),
                       "AlbertForPreTraining": (PreTraining, ALBERT_MLM + ALBERT_SOP)},
        default_architecture="AlbertModel",
        ignore=("embeddings.position_ids", "embeddings.token_type_ids", "predictions.decoder.bias"))


register(_family())
