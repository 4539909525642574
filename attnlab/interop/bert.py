"""BERT (Devlin et al. 2019) in the Hugging Face layout: BertModel and its heads (MaskedLM, PreTraining,
sequence/token classification, QA). The other encoder families reuse its renames and backbone table."""
from __future__ import annotations

from ..config import ConfigError, ModelConfig
from ..heads import MaskedLM, PreTraining, QuestionAnswering, SequenceClassification, TokenClassification
from ..models.encoder import Encoder
from .registry import HF_ACTIVATIONS, Family, Row, config_from_mapping, hf_activation, register

BERT_RENAMES = {
    "vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_heads", "intermediate_size": "intermediate_size",
    "max_position_embeddings": "max_position_embeddings", "type_vocab_size": "type_vocab_size",
    "hidden_dropout_prob": "dropout", "attention_probs_dropout_prob": "attention_dropout",
    "initializer_range": "initializer_range", "layer_norm_eps": "norm_eps", "pad_token_id": "pad_token_id",
}


def bert_config_from_hf(hf: dict, source: str = "config.json") -> ModelConfig:
    pos = hf.get("position_embedding_type", "absolute")
    if pos != "absolute":
        raise ConfigError(f"{source}: position_embedding_type={pos!r} is not supported (only 'absolute')")
    if hf.get("is_decoder") or hf.get("add_cross_attention"):
        raise ConfigError(f"{source}: BERT as a decoder (is_decoder/add_cross_attention) is not supported")
    fixed = dict(model_type="bert", activation=hf_activation(hf.get("hidden_act", "gelu"), source),
                 tie_word_embeddings=hf.get("tie_word_embeddings", True))
    return config_from_mapping(hf, source, BERT_RENAMES, fixed,
                               {"hidden_act", "position_embedding_type", "tie_word_embeddings"})


def bert_config_to_hf(cfg: ModelConfig) -> dict:
    act = {v: k for k, v in HF_ACTIVATIONS.items() if k in ("gelu", "relu", "gelu_new", "silu", "leaky_relu")}[cfg.activation]
    out = dict(cfg.extra)
    out.update({theirs: getattr(cfg, ours) for theirs, ours in BERT_RENAMES.items()})
    out.update(model_type="bert", hidden_act=act, position_embedding_type="absolute",
               tie_word_embeddings=cfg.tie_word_embeddings)
    return out


BERT_BACKBONE: list[Row] = [
    ("embeddings.tok", "embeddings.word_embeddings"),
    ("embeddings.pos", "embeddings.position_embeddings"),
    ("embeddings.seg", "embeddings.token_type_embeddings"),
    ("embeddings.norm", "embeddings.LayerNorm"),
    ("layers.{i}.attn.q", "encoder.layer.{i}.attention.self.query"),
    ("layers.{i}.attn.k", "encoder.layer.{i}.attention.self.key"),
    ("layers.{i}.attn.v", "encoder.layer.{i}.attention.self.value"),
    ("layers.{i}.attn.o", "encoder.layer.{i}.attention.output.dense"),
    ("layers.{i}.attn_norm", "encoder.layer.{i}.attention.output.LayerNorm"),
    ("layers.{i}.ffn.up", "encoder.layer.{i}.intermediate.dense"),
    ("layers.{i}.ffn.down", "encoder.layer.{i}.output.dense"),
    ("layers.{i}.ffn_norm", "encoder.layer.{i}.output.LayerNorm"),
    ("pooler.dense", "pooler.dense"),
]
BERT_MLM: list[Row] = [
    ("mlm.dense", "cls.predictions.transform.dense"),
    ("mlm.norm", "cls.predictions.transform.LayerNorm"),
    ("mlm.bias", "cls.predictions.bias"),
    ("mlm.decoder", "cls.predictions.decoder"),
]
BERT_NSP: list[Row] = [("nsp.linear", "cls.seq_relationship")]
BERT_CLASSIFIER: list[Row] = [("classifier", "classifier")]  # sequence and token classification
BERT_QA: list[Row] = [("qa_outputs", "qa_outputs")]


register(Family(
    model_type="bert", config_from_hf=bert_config_from_hf, config_to_hf=bert_config_to_hf,
    backbone_rows=BERT_BACKBONE, backbone_prefix="bert.",
    architectures={"BertModel": (Encoder, []), "BertForMaskedLM": (MaskedLM, BERT_MLM),
                   "BertForPreTraining": (PreTraining, BERT_MLM + BERT_NSP),
                   "BertForSequenceClassification": (SequenceClassification, BERT_CLASSIFIER),
                   "BertForTokenClassification": (TokenClassification, BERT_CLASSIFIER),
                   "BertForQuestionAnswering": (QuestionAnswering, BERT_QA)},
    default_architecture="BertModel",
    ignore=("embeddings.position_ids", "cls.predictions.decoder.bias")))
