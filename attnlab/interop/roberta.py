"""RoBERTa (Liu et al. 2019) in the Hugging Face layout: RobertaModel / RobertaForMaskedLM.

RoBERTa is BERT's architecture trained differently (§4: dynamic masking, no NSP, bigger batches, byte-level
BPE), so it is our `Encoder` with the BERT table under the `roberta.` prefix. Two differences are in
the weights' meaning rather than their shape:
- positions come from fairseq: real tokens count from padding_idx + 1 and pad tokens sit at padding_idx
  (hence 514 position rows for 512 tokens); `config.extra["position_offset"]` makes the Encoder do this;
- one token type (type_vocab_size=1), as there are no sentence pairs to tell apart without NSP.
The MLM head is BERT's with other names (`lm_head.*`), its activation fixed to GELU.

XLM-R (Conneau et al. 2020, §3) is this very architecture trained on 100 languages with a 250k SentencePiece
vocabulary and no language embeddings, so the `xlm-roberta` model type is the same family under another name
(XLMRobertaModel / XLMRobertaForMaskedLM, still under the `roberta.` prefix).
"""
from __future__ import annotations

from ..config import ConfigError, ModelConfig
from .bert import BERT_BACKBONE, BERT_RENAMES, bert_config_to_hf
from .registry import Family, Row, config_from_mapping, hf_activation, register

# our extra keys that have no place in an HF config.json
OURS_ONLY = ("position_offset", "head_activation")


def roberta_config_from_hf(hf: dict, source: str = "config.json", model_type: str = "roberta") -> ModelConfig:
    pos = hf.get("position_embedding_type", "absolute")
    if pos != "absolute":
        raise ConfigError(f"{source}: position_embedding_type={pos!r} is not supported (only 'absolute')")
    if hf.get("is_decoder") or hf.get("add_cross_attention"):
        raise ConfigError(f"{source}: RoBERTa as a decoder (is_decoder/add_cross_attention) is not supported")
    fixed = dict(model_type=model_type, activation=hf_activation(hf.get("hidden_act", "gelu"), source),
                 tie_word_embeddings=hf.get("tie_word_embeddings", True), pad_token_id=1,
                 bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"))
    cfg = config_from_mapping(hf, source, BERT_RENAMES, fixed,
                              {"hidden_act", "position_embedding_type", "tie_word_embeddings", "bos_token_id",
                               "eos_token_id"})
    if cfg.pad_token_id is None:
        raise ConfigError(f"{source}: pad_token_id is required (RoBERTa's positions start after it)")
    cfg.extra.update(position_offset=cfg.pad_token_id + 1, head_activation="gelu")
    return cfg


def roberta_config_to_hf(cfg: ModelConfig) -> dict:
    out = bert_config_to_hf(cfg)
    for key in OURS_ONLY:
        out.pop(key, None)
    out.update(model_type=cfg.model_type, bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id)
    return out


ROBERTA_MLM: list[Row] = [
    ("mlm.dense", "lm_head.dense"),
    ("mlm.norm", "lm_head.layer_norm"),
    ("mlm.bias", "lm_head.bias"),
    ("mlm.decoder", "lm_head.decoder"),
]


def _family(model_type: str, name: str) -> Family:
    from ..heads import MaskedLM
    from ..models.encoder import Encoder
    return Family(
        model_type=model_type, config_to_hf=roberta_config_to_hf,
        config_from_hf=lambda hf, source="config.json": roberta_config_from_hf(hf, source, model_type),
        backbone_rows=BERT_BACKBONE, backbone_prefix="roberta.",
        architectures={f"{name}Model": (Encoder, []), f"{name}ForMaskedLM": (MaskedLM, ROBERTA_MLM)},
        default_architecture=f"{name}Model",
        # the decoder's bias is the same tensor as lm_head.bias
        ignore=("embeddings.position_ids", "embeddings.token_type_ids", "lm_head.decoder.bias"))


register(_family("roberta", "Roberta"))
register(_family("xlm-roberta", "XLMRoberta"))
