"""T5 (Raffel et al. 2020) in the Hugging Face layout: T5ForConditionalGeneration; and the original
Transformer (Vaswani et al. 2017), which has no Hugging Face class and is saved under attnlab's own names.

T5 is our `Seq2SeqLM` with pre-LN RMSNorm, bias-free linears, unscaled q.k, no absolute positions and
one relative-bias table per stack, stored by HF in the first block ("block.0...relative_attention_bias")
and reused by the others, as ours is held by the stack and handed to every layer. Quirks handled here:
- one `shared` embedding serves encoder, decoder and (tied) output projection;
- `scale_decoder_outputs` (original T5; HF derives it from `tie_word_embeddings` in older configs)
  multiplies the decoder output by d_model^-0.5 before the projection;
- the gated FFN ("gated-gelu", T5 v1.1) stores gate and up as `wi_0` / `wi_1`, the plain one `wi`.
"""
from __future__ import annotations

from ..config import ConfigError, ModelConfig
from .registry import Family, Row, config_from_mapping, register

_RENAMES = {
    "vocab_size": "vocab_size", "d_model": "hidden_size", "d_kv": "head_dim", "d_ff": "intermediate_size",
    "num_layers": "num_layers", "num_heads": "num_heads", "relative_attention_num_buckets": "relative_num_buckets",
    "relative_attention_max_distance": "relative_max_distance", "dropout_rate": "dropout",
    "layer_norm_epsilon": "norm_eps", "pad_token_id": "pad_token_id", "eos_token_id": "eos_token_id",
}
# HF feed_forward_proj -> our activation ("gated-gelu" means the tanh GELU, HF's gelu_new)
_FFN = {"relu": "relu", "gelu": "gelu", "gated-gelu": "geglu_tanh", "gated-silu": "swiglu", "silu": "silu"}


def t5_config_from_hf(hf: dict, source: str = "config.json") -> ModelConfig:
    proj = hf.get("feed_forward_proj", "relu")
    if proj not in _FFN:
        raise ConfigError(f"{source}: feed_forward_proj={proj!r} is not supported; supported: {', '.join(_FFN)}")
    tie = hf.get("tie_word_embeddings", True) is not False
    hf = {**hf, "scale_decoder_outputs": hf.get("scale_decoder_outputs", tie)}
    fixed = dict(model_type="t5", position="relative_bias", norm="rmsnorm", norm_placement="pre", bias=False,
                 attention_scale=1.0, embedding_norm=False, type_vocab_size=0, pooler=False, final_norm=True,
                 activation=_FFN[proj], attention_dropout=hf.get("dropout_rate", 0.1), tie_word_embeddings=tie)
    return config_from_mapping(hf, source, _RENAMES, fixed, {"feed_forward_proj", "dense_act_fn", "is_gated_act",
                                                             "tie_word_embeddings"})


def t5_config_to_hf(cfg: ModelConfig) -> dict:
    proj = {v: k for k, v in _FFN.items()}.get(cfg.activation)
    if proj is None:
        raise ConfigError(f"config: activation={cfg.activation!r} has no T5 equivalent ({', '.join(_FFN.values())})")
    out = dict(cfg.extra)
    out.update({theirs: getattr(cfg, ours) for theirs, ours in _RENAMES.items()})
    out.update(model_type="t5", d_kv=cfg.dim_head, feed_forward_proj=proj, is_encoder_decoder=True,
               tie_word_embeddings=cfg.tie_word_embeddings,
               num_decoder_layers=cfg.extra.get("num_decoder_layers") or cfg.num_layers)
    return out


def _stack(ours: str, theirs: str, cross: bool) -> list[Row]:
    ffn = 2 if cross else 1  # the decoder's FFN is its third sublayer, after the cross-attention
    rows: list[Row] = [(f"{ours}.relative_bias.embedding",
                        f"{theirs}.block.0.layer.0.SelfAttention.relative_attention_bias")]
    rows += [(f"{ours}.layers.{{i}}.attn.{p}", f"{theirs}.block.{{i}}.layer.0.SelfAttention.{p}") for p in "qkvo"]
    rows.append((f"{ours}.layers.{{i}}.attn_norm", f"{theirs}.block.{{i}}.layer.0.layer_norm"))
    if cross:
        rows += [(f"{ours}.layers.{{i}}.cross_attn.{p}", f"{theirs}.block.{{i}}.layer.1.EncDecAttention.{p}")
                 for p in "qkvo"]
        rows.append((f"{ours}.layers.{{i}}.cross_norm", f"{theirs}.block.{{i}}.layer.1.layer_norm"))
    dense = f"{theirs}.block.{{i}}.layer.{ffn}.DenseReluDense"
    rows += [(f"{ours}.layers.{{i}}.ffn.up", f"{dense}.wi"),       # written as wi_1 for gated FFNs (_save_gated)
             (f"{ours}.layers.{{i}}.ffn.up", f"{dense}.wi_1"),
             (f"{ours}.layers.{{i}}.ffn.gate", f"{dense}.wi_0"),
             (f"{ours}.layers.{{i}}.ffn.down", f"{dense}.wo"),
             (f"{ours}.layers.{{i}}.ffn_norm", f"{theirs}.block.{{i}}.layer.{ffn}.layer_norm"),
             (f"{ours}.final_norm", f"{theirs}.final_layer_norm")]
    return rows


T5_ROWS: list[Row] = [("encoder.embeddings.tok", "shared"), ("decoder.embeddings.tok", "decoder.embed_tokens"),
                      *_stack("encoder", "encoder", cross=False), *_stack("decoder", "decoder", cross=True),
                      ("lm_head", "lm_head")]


def _save_gated(model, tensors: dict) -> None:
    """A gated FFN's up projection is HF's wi_1 (the table's first row for it says wi, the plain FFN)."""
    if model.config.is_glu:
        for key in [k for k in tensors if ".DenseReluDense.wi." in k]:
            tensors[key.replace(".DenseReluDense.wi.", ".DenseReluDense.wi_1.")] = tensors.pop(key)


# ----------------------------------------------------------------------------------- the original Transformer
def transformer_config_from_hf(hf: dict, source: str = "config.json") -> ModelConfig:
    """attnlab's own config.json (ModelConfig fields): the original Transformer has no HF class to map onto."""
    return ModelConfig.from_dict({k: v for k, v in hf.items() if k != "architectures"}, source=source)


def _families() -> list[Family]:
    from ..models.seq2seq import Seq2SeqLM
    t5 = Family(model_type="t5", config_from_hf=t5_config_from_hf, config_to_hf=t5_config_to_hf,
                backbone_rows=T5_ROWS, backbone_prefix="",
                architectures={"T5ForConditionalGeneration": (Seq2SeqLM, [])},
                default_architecture="T5ForConditionalGeneration",
                ignore=("encoder.embed_tokens.weight",), extra_save=_save_gated)
    native = Family(model_type="transformer", config_from_hf=transformer_config_from_hf,
                    config_to_hf=lambda cfg: cfg.to_dict(),
                    backbone_rows=[("encoder", "encoder"), ("decoder", "decoder"), ("lm_head", "lm_head")],
                    backbone_prefix="", architectures={"Transformer": (Seq2SeqLM, [])},
                    default_architecture="Transformer")
    return [t5, native]


for _family in _families():
    register(_family)
