"""DeBERTa-v2 / v3 (He et al. 2021; He et al. 2023) in the Hugging Face layout: DebertaV2Model,
DebertaV2ForMaskedLM, DebertaV2ForSequenceClassification (and token classification / QA).

DeBERTa is BERT's post-LN encoder with disentangled attention (`disentangled_attention`, nn/disentangled.py):
c2p and p2c scores from a shared table of relative-position embeddings (`encoder.rel_embeddings`, layer-normed
when norm_rel_ebd is "layer_norm"), log buckets (`position_buckets`), position keys projected by the layer's
own W_q/W_k (`share_att_key`) or by `pos_key_proj`/`pos_query_proj`. v2/v3 add no absolute positions to
the input (position_biased_input false -> position "none"). Quirks, each a value rather than code:
- the MLM head is BERT's under `cls.predictions.*` (legacy, transformers' default) or `lm_predictions.lm_head.*`
  (legacy false); both are our MLMHead tied to the word embeddings;
- the classifier's pooler (ContextPooler: dropout, dense, GELU) sits beside the backbone, not in it
  (extra head_pooler, pooler_activation); a classifier dropout of `cls_dropout`, else hidden dropout.
- the enhanced mask decoder (§3.3: absolute positions added just before the MLM head) is not in
  transformers' models (z_steps = 0; `mask_predictions.*` tensors are dropped), so not here either.
Not supported (an error naming the key): the v2-xlarge convolution (`conv_kernel_size`), an embedding size
other than the hidden size (DeBERTa projects after summing, then norms).
"""
from __future__ import annotations

from ..config import ConfigError, ModelConfig
from .bert import BERT_RENAMES
from .registry import HF_ACTIVATIONS, Family, Row, config_from_mapping, hf_activation, register

# our extra keys that have no place in an HF config.json (the family implies them)
OURS_ONLY = ("head_pooler", "pooler_activation", "classifier_dropout")
_ACT_BACK = {v: k for k, v in reversed(HF_ACTIVATIONS.items())}


def _att_types(value, source: str) -> list[str]:
    if value is None:
        return []
    kinds = [x.strip() for x in value.lower().split("|")] if isinstance(value, str) else list(value)
    if any(k not in ("c2p", "p2c") for k in kinds):
        raise ConfigError(f"{source}: pos_att_type={value!r} may hold only 'c2p' and 'p2c'")
    return list(dict.fromkeys(kinds))


def deberta_config_from_hf(hf: dict, source: str = "config.json") -> ModelConfig:
    if (hf.get("conv_kernel_size") or 0) > 0:
        raise ConfigError(f"{source}: conv_kernel_size={hf['conv_kernel_size']} (DeBERTa-v2's convolution "
                          "after the first layer) is not supported")
    emb = hf.get("embedding_size")
    if emb is not None and emb != hf.get("hidden_size", 1536):
        raise ConfigError(f"{source}: embedding_size={emb} differs from hidden_size; not supported for DeBERTa")
    kinds = _att_types(hf.get("pos_att_type"), source)
    relative = bool(hf.get("relative_attention", False))
    if relative and not kinds:
        raise ConfigError(f"{source}: relative_attention=true with no pos_att_type adds no position scores; "
                          "not supported")
    rel_norm = [x.strip() for x in str(hf.get("norm_rel_ebd") or "none").lower().split("|")]
    fixed = dict(model_type="deberta-v2", activation=hf_activation(hf.get("hidden_act", "gelu"), source),
                 type_vocab_size=hf.get("type_vocab_size", 0), norm_eps=hf.get("layer_norm_eps", 1e-7),
                 position="learned" if hf.get("position_biased_input", True) else "none", pooler=False,
                 tie_word_embeddings=hf.get("tie_word_embeddings", True) is not False,
                 disentangled_attention=kinds if relative else [],
                 position_buckets=max(0, int(hf.get("position_buckets") or -1)) if relative else 0,
                 max_relative_positions=(hf.get("max_relative_positions") or -1) if relative else None,
                 share_att_key=bool(hf.get("share_att_key", False)) and relative,
                 relative_embedding_norm="layer_norm" in rel_norm and relative)
    if fixed["max_relative_positions"] is not None and fixed["max_relative_positions"] < 1:
        fixed["max_relative_positions"] = None  # -1: max_position_embeddings
    if not relative and kinds:  # transformers still scales Q Kᵀ by 1/sqrt((1 + n) d)
        heads = hf.get("num_attention_heads", 24)
        fixed["attention_scale"] = (hf.get("attention_head_size") or hf.get("hidden_size", 1536) // heads) ** -0.5 \
            / (1 + len(kinds)) ** 0.5
    if hf.get("attention_head_size") is not None:
        fixed["head_dim"] = hf["attention_head_size"]
    cfg = config_from_mapping(hf, source, BERT_RENAMES, fixed,
                              {"hidden_act", "type_vocab_size", "layer_norm_eps", "position_biased_input",
                               "tie_word_embeddings", "pos_att_type", "relative_attention", "position_buckets",
                               "max_relative_positions", "share_att_key", "norm_rel_ebd", "pooler_hidden_act",
                               "attention_head_size", "embedding_size", "pooler_hidden_size", "conv_kernel_size"})
    cfg.extra.update(head_pooler=True, pooler_activation=hf_activation(hf.get("pooler_hidden_act") or "gelu", source))
    if hf.get("cls_dropout") is not None:
        cfg.extra["classifier_dropout"] = hf["cls_dropout"]
    return cfg


def deberta_config_to_hf(cfg: ModelConfig) -> dict:
    if cfg.activation not in _ACT_BACK or cfg.extra.get("pooler_activation", "gelu") not in _ACT_BACK:
        raise ConfigError(f"config: activation={cfg.activation!r} has no DeBERTa equivalent")
    if cfg.position not in ("learned", "none"):
        raise ConfigError(f"config: position={cfg.position!r} has no DeBERTa equivalent (learned or none)")
    out = {k: v for k, v in cfg.extra.items() if k not in OURS_ONLY}
    out.update({theirs: getattr(cfg, ours) for theirs, ours in BERT_RENAMES.items()})
    rel = bool(cfg.disentangled_attention)
    out.update(model_type="deberta-v2", hidden_act=_ACT_BACK[cfg.activation], relative_attention=rel,
               pos_att_type=list(cfg.disentangled_attention), position_biased_input=cfg.position == "learned",
               position_buckets=cfg.position_buckets or -1, max_relative_positions=cfg.max_relative_positions or -1,
               share_att_key=cfg.share_att_key, norm_rel_ebd="layer_norm" if cfg.relative_embedding_norm else "none",
               pooler_hidden_act=_ACT_BACK[cfg.extra.get("pooler_activation", "gelu")],
               tie_word_embeddings=cfg.tie_word_embeddings)
    if cfg.head_dim is not None:
        out["attention_head_size"] = cfg.head_dim
    if "classifier_dropout" in cfg.extra:
        out["cls_dropout"] = cfg.extra["classifier_dropout"]
    return out


_LAYER, _HF = "layers.{i}", "encoder.layer.{i}"
DEBERTA_BACKBONE: list[Row] = [
    ("embeddings.tok", "embeddings.word_embeddings"),
    ("embeddings.pos", "embeddings.position_embeddings"),
    ("embeddings.seg", "embeddings.token_type_embeddings"),
    ("embeddings.norm", "embeddings.LayerNorm"),
    ("rel_positions.embeddings", "encoder.rel_embeddings"),
    ("rel_positions.norm", "encoder.LayerNorm"),
    (f"{_LAYER}.attn.q", f"{_HF}.attention.self.query_proj"),
    (f"{_LAYER}.attn.k", f"{_HF}.attention.self.key_proj"),
    (f"{_LAYER}.attn.v", f"{_HF}.attention.self.value_proj"),
    (f"{_LAYER}.attn.rel.pos_k", f"{_HF}.attention.self.pos_key_proj"),
    (f"{_LAYER}.attn.rel.pos_q", f"{_HF}.attention.self.pos_query_proj"),
    (f"{_LAYER}.attn.o", f"{_HF}.attention.output.dense"),
    (f"{_LAYER}.attn_norm", f"{_HF}.attention.output.LayerNorm"),
    (f"{_LAYER}.ffn.up", f"{_HF}.intermediate.dense"),
    (f"{_LAYER}.ffn.down", f"{_HF}.output.dense"),
    (f"{_LAYER}.ffn_norm", f"{_HF}.output.LayerNorm"),
]
# legacy (transformers' default) first: saving writes the first matching row; `_save_head` renames for legacy false
DEBERTA_MLM: list[Row] = [
    ("mlm.dense", "cls.predictions.transform.dense"),
    ("mlm.norm", "cls.predictions.transform.LayerNorm"),
    ("mlm.bias", "cls.predictions.bias"),
    ("mlm.decoder", "cls.predictions.decoder"),
    ("mlm.dense", "lm_predictions.lm_head.dense"),
    ("mlm.norm", "lm_predictions.lm_head.LayerNorm"),
    ("mlm.bias", "lm_predictions.lm_head.bias"),
]
_NEW_MLM = {"cls.predictions.transform.dense": "lm_predictions.lm_head.dense",
            "cls.predictions.transform.LayerNorm": "lm_predictions.lm_head.LayerNorm",
            "cls.predictions.bias": "lm_predictions.lm_head.bias"}
DEBERTA_CLASSIFIER: list[Row] = [("backbone.pooler.dense", "pooler.dense"), ("classifier", "classifier")]


def _save_head(model, tensors: dict) -> None:
    """A legacy=false config names the MLM head lm_predictions.lm_head.* (transformers reads those only)."""
    if model.config.extra.get("legacy", True) is not False:
        return
    for key in list(tensors):
        for old, new in _NEW_MLM.items():
            if key == old or key.startswith(old + "."):
                tensors[new + key[len(old):]] = tensors.pop(key)
                break


def _family() -> Family:
    from ..heads import MaskedLM, QuestionAnswering, SequenceClassification, TokenClassification
    from ..models.encoder import Encoder
    return Family(
        model_type="deberta-v2", config_from_hf=deberta_config_from_hf, config_to_hf=deberta_config_to_hf,
        backbone_rows=DEBERTA_BACKBONE, backbone_prefix="deberta.",
        architectures={"DebertaV2Model": (Encoder, []), "DebertaV2ForMaskedLM": (MaskedLM, DEBERTA_MLM),
                       "DebertaV2ForSequenceClassification": (SequenceClassification, DEBERTA_CLASSIFIER),
                       "DebertaV2ForTokenClassification": (TokenClassification, [("classifier", "classifier")]),
                       "DebertaV2ForQuestionAnswering": (QuestionAnswering, [("qa_outputs", "qa_outputs")])},
        default_architecture="DebertaV2Model",
        ignore=("embeddings.position_ids", "cls.predictions.decoder.bias"),
        extra_save=_save_head)


register(_family())
