"""BigBird (Zaheer et al. 2020) in the Hugging Face layout: BigBirdModel / BigBirdForMaskedLM.

BERT's encoder (same weight names under "bert.") whose self-attention is `attention_kind: block_sparse`
(nn/block_sparse.py): blocks of `block_size` tokens, each query block sees the first and last block,
its own and its two neighbours, and `num_random_blocks` random blocks. `attention_type: original_full`
is plain attention (`attention_kind: softmax`). transformers pads the input to whole blocks and uses
full attention for sequences of at most (5 + 2 r) blocks; our attention does the same, inside the layer.
`use_bias` is our `qkv_bias` (the output projection keeps its bias), `rescale_embeddings` our
`scale_embeddings` (token embeddings times sqrt(hidden_size)). In training our block-sparse layer draws
fresh random blocks per call and applies `attention_dropout` to its probabilities; transformers' block-sparse
layer applies no attention dropout (eval, where parity is checked, has neither).
"""
from __future__ import annotations

from ..config import ConfigError, ModelConfig
from ..heads import MaskedLM
from ..models.encoder import Encoder
from .bert import BERT_BACKBONE, BERT_MLM, BERT_RENAMES, bert_config_to_hf
from .registry import Family, Row, config_from_mapping, hf_activation, register

RENAMES = {**BERT_RENAMES, "block_size": "sparse_block_size", "num_random_blocks": "num_random_blocks",
           "use_bias": "qkv_bias", "rescale_embeddings": "scale_embeddings"}
KINDS = {"block_sparse": "block_sparse", "original_full": "softmax"}


def bigbird_config_from_hf(hf: dict, source: str = "config.json") -> ModelConfig:
    kind = hf.get("attention_type", "block_sparse")
    if kind not in KINDS:
        raise ConfigError(f"{source}: attention_type={kind!r} is not one of {', '.join(KINDS)}")
    if hf.get("is_decoder") or hf.get("add_cross_attention"):
        raise ConfigError(f"{source}: BigBird as a decoder (is_decoder/add_cross_attention) is not supported")
    fixed = dict(model_type="big_bird", activation=hf_activation(hf.get("hidden_act", "gelu_new"), source),
                 tie_word_embeddings=hf.get("tie_word_embeddings", True), attention_kind=KINDS[kind],
                 qkv_bias=hf.get("use_bias", True), bos_token_id=hf.get("bos_token_id", 1),
                 eos_token_id=hf.get("eos_token_id", 2))
    defaults = {"block_size": 64, "num_random_blocks": 3, "max_position_embeddings": 4096, "pad_token_id": 0}
    return config_from_mapping({**defaults, **hf}, source, RENAMES, fixed,
                               {"hidden_act", "tie_word_embeddings", "attention_type", "bos_token_id",
                                "eos_token_id"})


def bigbird_config_to_hf(cfg: ModelConfig) -> dict:
    if cfg.attention_kind not in KINDS.values():
        raise ConfigError(f"config: attention_kind={cfg.attention_kind!r}: a BigBird checkpoint holds block_sparse "
                          "or softmax (original_full) attention")
    out = bert_config_to_hf(cfg)
    out.pop("position_embedding_type", None)
    out.update({theirs: getattr(cfg, ours) for theirs, ours in RENAMES.items() if theirs not in BERT_RENAMES})
    out.update(model_type="big_bird", use_bias=cfg.bias if cfg.qkv_bias is None else cfg.qkv_bias,
               attention_type={v: k for k, v in KINDS.items()}[cfg.attention_kind],
               bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id)
    return out


# BERT's rows, but the pooler is one Linear named "pooler" (BERT: "pooler.dense")
BIGBIRD_BACKBONE: list[Row] = [row if row[0] != "pooler.dense" else ("pooler.dense", "pooler") for row in BERT_BACKBONE]


class BigBirdMaskedLM(MaskedLM):
    """The MLM head over a backbone that keeps its pooler: transformers' BigBirdForMaskedLM builds
    BigBirdModel with one (BertForMaskedLM does not), so its checkpoints carry bert.pooler."""
    uses_pooler = True


def _family() -> Family:
    return Family(
        model_type="big_bird", config_from_hf=bigbird_config_from_hf, config_to_hf=bigbird_config_to_hf,
        backbone_rows=BIGBIRD_BACKBONE, backbone_prefix="bert.",
        architectures={"BigBirdModel": (Encoder, []), "BigBirdForMaskedLM": (BigBirdMaskedLM, BERT_MLM)},
        default_architecture="BigBirdModel",
        ignore=("embeddings.position_ids", "embeddings.token_type_ids", "cls.predictions.decoder.bias"))


register(_family())
