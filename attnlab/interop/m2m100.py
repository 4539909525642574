"""M2M-100 (Fan et al. 2020, "Beyond English-Centric Multilingual Machine Translation") in the Hugging Face
layout: M2M100ForConditionalGeneration and the bare M2M100Model.

M2M-100 is our `Seq2SeqLM` with switches, no class of its own (preset "m2m100_418M"):
- pre-LN blocks with a final LayerNorm on each stack (fairseq's `--encoder-normalize-before`), ReLU FFN;
- fairseq's sinusoidal positions (`position: sinusoidal`, `extra.sinusoid_fairseq`): sines then cosines,
  frequencies 10000^(-i/(d/2-1)), counted from padding_idx + 1 = 2 over the real tokens only (padding takes
  the all-zero row 1; `position_offset: 2` with pad-aware positions, in the decoder too), so the table holds
  max_position_embeddings + 2 rows, our `max_position_embeddings`; config.json states 2 fewer;
- token embeddings times sqrt(d_model) (`scale_embedding`), one `shared` matrix for encoder, decoder and
  the tied output projection, no bias on the logits, no LayerNorm on the embeddings;
- one vocabulary for 100 languages: the source starts with its language token (`__en__`), the decoder
  starts from </s> = 2 and is forced to write the target's language token first (`forced_bos_token_id`
  in `attnlab.inference.seq2seq.generate`; `finetune translation --directions` trains the same way).
Layerdrop and activation dropout (training only) are kept in `extra` for the round trip.
"""
from __future__ import annotations

from ..config import ConfigError, ModelConfig
from .bart import BART_CONSUMED, BART_RENAMES, bart_stack_rows, check_stacks_agree, stacks_to_hf
from .registry import Family, Row, config_from_mapping, hf_activation, register

POSITION_OFFSET = 2  # fairseq: positions count from padding_idx + 1, and M2M-100's padding_idx is 1
OURS_ONLY = ("position_offset", "sinusoid_fairseq", "num_decoder_layers", "pad_aware_positions")


def m2m100_config_from_hf(hf: dict, source: str = "config.json") -> ModelConfig:
    check_stacks_agree(hf, source)
    pad = hf.get("pad_token_id", 1)
    if pad != POSITION_OFFSET - 1:  # fairseq counts positions from padding_idx + 1; the table assumes 2
        raise ConfigError(f"{source}: pad_token_id={pad} is not supported for m2m_100 (positions start at "
                          f"pad_token_id + 1 = {POSITION_OFFSET} in its checkpoints)")
    fixed = dict(model_type="m2m_100", position="sinusoidal", norm="layernorm", norm_placement="pre", bias=True,
                 embedding_norm=False, final_norm=True, pooler=False, type_vocab_size=0, norm_eps=1e-5,
                 activation=hf_activation(hf.get("activation_function") or "relu", source),
                 scale_embeddings=bool(hf.get("scale_embedding", True)), pad_token_id=pad,
                 max_position_embeddings=int(hf.get("max_position_embeddings") or 1024) + POSITION_OFFSET,
                 tie_word_embeddings=hf.get("tie_word_embeddings", True) is not False)
    cfg = config_from_mapping(hf, source, BART_RENAMES, fixed, BART_CONSUMED)
    cfg.extra.update(num_decoder_layers=int(hf.get("decoder_layers") or cfg.num_layers),
                     decoder_start_token_id=hf.get("decoder_start_token_id", 2), position_offset=POSITION_OFFSET,
                     sinusoid_fairseq=True)
    return cfg


def m2m100_config_to_hf(cfg: ModelConfig) -> dict:
    # switches M2M-100 checkpoints cannot hold and that check_expressible's signature does not compare
    if (cfg.extra.get("position_offset") != POSITION_OFFSET or not cfg.extra.get("sinusoid_fairseq")
            or not cfg.extra.get("pad_aware_positions", True) or cfg.pad_token_id != POSITION_OFFSET - 1):
        raise ConfigError("config: M2M-100 checkpoints need fairseq's sinusoids (extra.sinusoid_fairseq=true, "
                          "extra.position_offset=2, pad_token_id=1)")
    if not cfg.extra.get("share_embeddings", True) or cfg.extra.get("final_logits_bias"):
        raise ConfigError("config: M2M-100 checkpoints share one embedding and have no final_logits_bias")
    return stacks_to_hf(cfg, "m2m_100", POSITION_OFFSET, OURS_ONLY)


def _rows(prefix: str) -> list[Row]:
    """BART's layer names (no position table: fairseq's sinusoids are computed, not stored; no embedding
    LayerNorm here, so those rows of BART's stack never match) plus each stack's final LayerNorm."""
    return [(("encoder.embeddings.tok", f"{prefix}shared")),
            ("encoder.embeddings.tok", f"{prefix}encoder.embed_tokens"),
            ("decoder.embeddings.tok", f"{prefix}decoder.embed_tokens"),
            *bart_stack_rows("encoder", f"{prefix}encoder", cross=False), *bart_stack_rows("decoder", f"{prefix}decoder", cross=True),
            ("encoder.final_norm", f"{prefix}encoder.layer_norm"), ("decoder.final_norm", f"{prefix}decoder.layer_norm")]


# M2M100ForConditionalGeneration keeps the model under "model." (its rows come first: what a save writes);
# a bare M2M100Model checkpoint has the same names without it, and no lm_head (tied to `shared`).
M2M100_ROWS: list[Row] = [*_rows("model."), ("lm_head", "lm_head"), *_rows("")]


def _family() -> Family:
    from ..models.seq2seq import Seq2SeqLM
    return Family(model_type="m2m_100", config_from_hf=m2m100_config_from_hf, config_to_hf=m2m100_config_to_hf,
                  backbone_rows=M2M100_ROWS, backbone_prefix="",
                  architectures={"M2M100ForConditionalGeneration": (Seq2SeqLM, []), "M2M100Model": (Seq2SeqLM, [])},
                  default_architecture="M2M100ForConditionalGeneration",
                  # older checkpoints store fairseq's position buffers; they are recomputed
                  ignore=tuple(f"{p}{s}.embed_positions.{b}" for p in ("model.", "") for s in ("encoder", "decoder")
                               for b in ("weights", "_float_tensor")))


register(_family())
