"""Longformer (Beltagy et al. 2020) in the Hugging Face layout: LongformerModel / LongformerForMaskedLM.

RoBERTa's encoder (fairseq positions from padding_idx + 1) whose self-attention is local: a token sees the
tokens within attention_window / 2 on each side (§3.1, "sliding window"), i.e. our `sliding_window` =
attention_window / 2 + 1 (we count |q - k| < window). Tokens marked in `global_attention_mask` see every
token and are seen by every token, their own outputs computed with separate projections (query_global,
key_global, value_global: `global_attention: true`). With `attn_implementation: tiled` the local layers
skip every tile outside the band and the global rows cost O(n_global T), so time and memory grow linearly.
Only one window for all layers is supported (HF allows a list; a list of different sizes is an error).
"""
from __future__ import annotations

from ..config import ConfigError, ModelConfig
from .bert import BERT_BACKBONE, BERT_RENAMES, bert_config_to_hf
from .registry import Family, Row, config_from_mapping, hf_activation, register
from .roberta import ROBERTA_MLM

OURS_ONLY = ("position_offset", "head_activation")


def longformer_config_from_hf(hf: dict, source: str = "config.json") -> ModelConfig:
    windows = hf.get("attention_window", 512)
    windows = windows if isinstance(windows, list) else [windows]
    if len(set(windows)) != 1 or not isinstance(windows[0], int) or windows[0] <= 0 or windows[0] % 2:
        raise ConfigError(f"{source}: attention_window={windows if len(windows) > 1 else windows[0]!r}: only one "
                          "positive even window for every layer is supported")
    fixed = dict(model_type="longformer", activation=hf_activation(hf.get("hidden_act", "gelu"), source),
                 tie_word_embeddings=hf.get("tie_word_embeddings", True), pad_token_id=hf.get("pad_token_id", 1),
                 bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
                 sliding_window=windows[0] // 2 + 1, global_attention=True)
    cfg = config_from_mapping(hf, source, BERT_RENAMES, fixed,
                              {"hidden_act", "tie_word_embeddings", "bos_token_id", "eos_token_id",
                               "attention_window", "pad_token_id"})
    if cfg.pad_token_id is None:
        raise ConfigError(f"{source}: pad_token_id is required (Longformer's positions start after it)")
    cfg.extra.update(position_offset=cfg.pad_token_id + 1, head_activation="gelu")
    return cfg


def longformer_config_to_hf(cfg: ModelConfig) -> dict:
    if not cfg.sliding_window or not cfg.global_attention:
        raise ConfigError(f"config: a Longformer checkpoint needs sliding_window and global_attention "
                          f"(got sliding_window={cfg.sliding_window}, global_attention={cfg.global_attention})")
    out = bert_config_to_hf(cfg)
    for key in OURS_ONLY:
        out.pop(key, None)
    out.update(model_type="longformer", bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id,
               attention_window=[2 * (cfg.sliding_window - 1)] * cfg.num_layers)
    return out


LONGFORMER_BACKBONE: list[Row] = BERT_BACKBONE + [
    (f"layers.{{i}}.attn.{p}_global", f"encoder.layer.{{i}}.attention.self.{name}_global")
    for p, name in (("q", "query"), ("k", "key"), ("v", "value"))]


def _family() -> Family:
    from ..heads import MaskedLM
    from ..models.encoder import Encoder
    return Family(
        model_type="longformer", config_from_hf=longformer_config_from_hf, config_to_hf=longformer_config_to_hf,
        backbone_rows=LONGFORMER_BACKBONE, backbone_prefix="longformer.",
        architectures={"LongformerModel": (Encoder, []), "LongformerForMaskedLM": (MaskedLM, ROBERTA_MLM)},
        default_architecture="LongformerModel",
        ignore=("embeddings.position_ids", "embeddings.token_type_ids", "lm_head.decoder.bias"))


register(_family())
