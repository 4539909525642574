"""BART (Lewis et al. 2019) in the Hugging Face layout: BartForConditionalGeneration.

BART is our `Seq2SeqLM` with the original Transformer's post-LN blocks, GELU, a LayerNorm right after
the embeddings of each stack ("layernorm_embedding"), and learned positions (preset "bart-base"). The
quirks of its checkpoints, each a value in `config.extra` rather than code:
- fairseq's learned positions start at index 2 whatever the padding (`position_offset: 2`,
  `pad_aware_positions: false`): the tables hold max_position_embeddings + 2 rows, which is our
  `max_position_embeddings`; config.json states 2 fewer;
- one `shared` embedding serves encoder, decoder and the tied output projection, saved once;
- `final_logits_bias`, a (1, V) buffer added to the logits (`final_logits_bias: true`);
- `scale_embedding` (false in bart-base/large) multiplies token embeddings by sqrt(d_model);
- decoding starts from `decoder_start_token_id` = </s> = 2.
The encoder and the decoder must agree in heads and FFN width (one config describes both stacks).
"""
from __future__ import annotations

from ..config import ConfigError, ModelConfig
from .registry import HF_ACTIVATIONS, Family, Row, config_from_mapping, hf_activation, register

POSITION_OFFSET = 2  # fairseq's LearnedPositionalEmbedding: rows 0 and 1 are never used by BART
BART_RENAMES = {
    "vocab_size": "vocab_size", "d_model": "hidden_size", "encoder_layers": "num_layers",
    "encoder_attention_heads": "num_heads", "encoder_ffn_dim": "intermediate_size", "dropout": "dropout",
    "attention_dropout": "attention_dropout", "init_std": "initializer_range", "pad_token_id": "pad_token_id",
    "bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id",
}
# our extra keys with no place in an HF config.json (the family implies them)
OURS_ONLY = ("position_offset", "pad_aware_positions", "final_logits_bias", "num_decoder_layers")


def check_stacks_agree(hf: dict, source: str) -> None:
    """BART-style configs (BART, M2M-100) size each stack; ours has one size for both."""
    for ours, theirs in (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim")):
        if theirs in hf and ours in hf and hf[theirs] != hf[ours]:
            raise ConfigError(f"{source}: {theirs}={hf[theirs]} differs from {ours}={hf[ours]}; attnlab's one "
                              "config describes both stacks, so they must be equal")


# HF keys a BART-style config.json states and our config implies (consumed, not kept in extra)
BART_CONSUMED = {"activation_function", "scale_embedding", "max_position_embeddings", "tie_word_embeddings",
                 "decoder_attention_heads", "decoder_ffn_dim", "decoder_layers", "num_hidden_layers",
                 "num_attention_heads", "hidden_size"}


def stacks_to_hf(cfg: ModelConfig, model_type: str, position_offset: int, ours_only: tuple[str, ...]) -> dict:
    """The config.json of a BART-style encoder-decoder (BART, M2M-100): extra minus our own keys, then both
    stacks' sizes from the one config."""
    act = {v: k for k, v in reversed(HF_ACTIVATIONS.items())}.get(cfg.activation)
    if act is None:
        raise ConfigError(f"config: activation={cfg.activation!r} has no {model_type} equivalent")
    out = {k: v for k, v in cfg.extra.items() if k not in ours_only}
    out.update({theirs: getattr(cfg, ours) for theirs, ours in BART_RENAMES.items()})
    out.update(model_type=model_type, activation_function=act, scale_embedding=cfg.scale_embeddings,
               max_position_embeddings=cfg.max_position_embeddings - position_offset,
               decoder_layers=int(cfg.extra.get("num_decoder_layers") or cfg.num_layers),
               decoder_attention_heads=cfg.num_heads, decoder_ffn_dim=cfg.intermediate_size,
               decoder_start_token_id=cfg.extra.get("decoder_start_token_id", 2), is_encoder_decoder=True,
               tie_word_embeddings=cfg.tie_word_embeddings)
    return out


def bart_config_from_hf(hf: dict, source: str = "config.json") -> ModelConfig:
    check_stacks_agree(hf, source)
    fixed = dict(model_type="bart", position="learned", norm="layernorm", norm_placement="post", bias=True,
                 embedding_norm=True, final_norm=False, pooler=False, type_vocab_size=0, norm_eps=1e-5,
                 activation=hf_activation(hf.get("activation_function") or "gelu", source),
                 scale_embeddings=bool(hf.get("scale_embedding", False)),
                 max_position_embeddings=int(hf.get("max_position_embeddings") or 1024) + POSITION_OFFSET,
                 tie_word_embeddings=hf.get("tie_word_embeddings", True) is not False)
    cfg = config_from_mapping(hf, source, BART_RENAMES, fixed, BART_CONSUMED)
    cfg.extra.update(num_decoder_layers=int(hf.get("decoder_layers") or cfg.num_layers),
                     decoder_start_token_id=hf.get("decoder_start_token_id", 2), position_offset=POSITION_OFFSET,
                     pad_aware_positions=False, final_logits_bias=True)
    return cfg


def bart_config_to_hf(cfg: ModelConfig) -> dict:
    # switches BART checkpoints cannot hold and that check_expressible's signature does not compare
    if cfg.extra.get("position_offset") != POSITION_OFFSET or cfg.extra.get("pad_aware_positions", True):
        raise ConfigError("config: BART checkpoints need extra.position_offset=2 and extra.pad_aware_positions=false")
    if not cfg.extra.get("share_embeddings", True):
        raise ConfigError("config: BART checkpoints share one embedding between encoder and decoder "
                          "(extra.share_embeddings=false cannot be saved as BART)")
    return stacks_to_hf(cfg, "bart", POSITION_OFFSET, OURS_ONLY)


def bart_stack_rows(ours: str, theirs: str, cross: bool) -> list[Row]:
    layer, hf = f"{ours}.layers.{{i}}", f"{theirs}.layers.{{i}}"
    rows: list[Row] = [(f"{ours}.embeddings.pos", f"{theirs}.embed_positions"),
                       (f"{ours}.embeddings.norm", f"{theirs}.layernorm_embedding")]
    rows += [(f"{layer}.attn.{p}", f"{hf}.self_attn.{p}_proj") for p in "qkv"]
    rows += [(f"{layer}.attn.o", f"{hf}.self_attn.out_proj"), (f"{layer}.attn_norm", f"{hf}.self_attn_layer_norm")]
    if cross:
        rows += [(f"{layer}.cross_attn.{p}", f"{hf}.encoder_attn.{p}_proj") for p in "qkv"]
        rows += [(f"{layer}.cross_attn.o", f"{hf}.encoder_attn.out_proj"),
                 (f"{layer}.cross_norm", f"{hf}.encoder_attn_layer_norm")]
    rows += [(f"{layer}.ffn.up", f"{hf}.fc1"), (f"{layer}.ffn.down", f"{hf}.fc2"),
             (f"{layer}.ffn_norm", f"{hf}.final_layer_norm")]
    return rows


BART_ROWS: list[Row] = [
    ("encoder.embeddings.tok", "model.shared"),              # the first row wins when saving: written once
    ("encoder.embeddings.tok", "model.encoder.embed_tokens"),  # the same tensor, if a file repeats it
    ("decoder.embeddings.tok", "model.decoder.embed_tokens"),
    *bart_stack_rows("encoder", "model.encoder", cross=False), *bart_stack_rows("decoder", "model.decoder", cross=True),
    ("lm_head", "lm_head"), ("final_logits_bias", "final_logits_bias"),
]


def _family() -> Family:
    from ..models.seq2seq import Seq2SeqLM
    return Family(model_type="bart", config_from_hf=bart_config_from_hf, config_to_hf=bart_config_to_hf,
                  backbone_rows=BART_ROWS, backbone_prefix="",
                  architectures={"BartForConditionalGeneration": (Seq2SeqLM, [])},
                  default_architecture="BartForConditionalGeneration")


register(_family())
