"""XLNet (Yang et al. 2019) in the Hugging Face layout: XLNetModel and XLNetLMHeadModel.

XLNet is our Encoder with `position: relative_xl` (Transformer-XL relative attention, nn/relative_xl.py),
`relative_segments` (relative segment encodings), no absolute positions, no segment embeddings and no
LayerNorm on the embeddings, post-LN blocks whose attention projections carry no bias. The checkpoint's
quirks, each handled by a table row rather than code:
- q, k, v, r, o are stored as (d_model, heads, head_dim) parameters used through einsum, not nn.Linear:
  q/k/v/r are our Linear weights transposed and reshaped, o is ours reshaped (`HeadTensor`);
- `mask_emb` (1, 1, d_model) is the query stream's start vector (our `xl.mask_emb`);
- the LM head `lm_loss` is tied to the word embedding and has a bias.
attn_type "uni" is `causal: true`; bi_data (two directions in one batch) and same_length are refused by name.
mems / perm_mask / target_mapping keep transformers' meaning (mems time-first: (mem_len, batch, d_model)).
"""
from __future__ import annotations

import torch

from ..config import ConfigError, ModelConfig
from .files import CheckpointError
from .registry import HF_ACTIVATIONS, Family, Row, config_from_mapping, hf_activation, register

_RENAMES = {"vocab_size": "vocab_size", "d_model": "hidden_size", "n_layer": "num_layers", "n_head": "num_heads",
            "d_inner": "intermediate_size", "layer_norm_eps": "norm_eps", "dropout": "dropout",
            "initializer_range": "initializer_range", "pad_token_id": "pad_token_id", "bos_token_id": "bos_token_id",
            "eos_token_id": "eos_token_id", "mem_len": "mem_len", "reuse_len": "reuse_len"}
_ACT_BACK = {v: k for k, v in reversed(HF_ACTIVATIONS.items())}


def xlnet_config_from_hf(hf: dict, source: str = "config.json") -> ModelConfig:
    for key in ("bi_data", "same_length"):
        if hf.get(key):
            raise ConfigError(f"{source}: {key}=true is not supported (XLNet pretraining's "
                              + ("forward + backward order batches" if key == "bi_data" else "equal-length attention")
                              + "); set it to false")
    attn_type = hf.get("attn_type", "bi")
    if attn_type not in ("bi", "uni"):
        raise ConfigError(f"{source}: attn_type={attn_type!r}: expected 'bi' or 'uni'")
    d, heads = hf.get("d_model", 1024), hf.get("n_head", 16)
    if hf.get("d_head") is not None and isinstance(d, int) and isinstance(heads, int) and heads > 0 \
            and hf["d_head"] * heads != d:
        raise ConfigError(f"{source}: d_head={hf['d_head']} times n_head={heads} differs from d_model={d}")
    fixed = dict(model_type="xlnet", position="relative_xl", relative_segments=True, norm="layernorm",
                 norm_placement="post", bias=True, qkv_bias=False, embedding_norm=False, final_norm=False,
                 pooler=False, type_vocab_size=0, causal=attn_type == "uni", max_position_embeddings=512,
                 activation=hf_activation(hf.get("ff_activation") or "gelu", source),
                 attention_dropout=hf.get("dropout", 0.1), tie_word_embeddings=hf.get("tie_word_embeddings", True)
                 is not False)
    return config_from_mapping(hf, source, _RENAMES, fixed,
                               {"ff_activation", "attn_type", "d_head", "tie_word_embeddings", "bi_data",
                                "same_length"})


def xlnet_config_to_hf(cfg: ModelConfig) -> dict:
    act = _ACT_BACK.get(cfg.activation)
    if act is None:
        raise ConfigError(f"config: activation={cfg.activation!r} has no XLNet equivalent")
    out = dict(cfg.extra)
    out.update({theirs: getattr(cfg, ours) for theirs, ours in _RENAMES.items()})
    out.update(model_type="xlnet", ff_activation=act, d_head=cfg.dim_head, attn_type="uni" if cfg.causal else "bi",
               bi_data=False, same_length=False, tie_word_embeddings=cfg.tie_word_embeddings)
    return out


class HeadTensor:
    """XLNet's (d_model, heads, head_dim) projections against our Linear weights: q/k/v/r are (heads *
    head_dim, d_model), i.e. transposed (`transpose=True`); o is (d_model, heads * head_dim), a reshape."""

    def __init__(self, heads: int, transpose: bool) -> None:
        self.heads, self.transpose = heads, transpose

    def __call__(self, value: torch.Tensor, to_hf: bool) -> torch.Tensor:
        if to_hf:
            w = value.t() if self.transpose else value
            return w.reshape(w.size(0), self.heads, -1)
        if value.dim() != 3:
            raise CheckpointError(f"shape {tuple(value.shape)}; expected XLNet's (d_model, heads, head_dim)")
        w = value.reshape(value.size(0), -1)
        return w.t().contiguous() if self.transpose else w


def xlnet_rows(cfg: ModelConfig) -> list[Row]:
    layer, hf = "layers.{i}", "layer.{i}"
    proj, out = HeadTensor(cfg.num_heads, transpose=True), HeadTensor(cfg.num_heads, transpose=False)
    return [
        ("embeddings.tok", "word_embedding"), ("xl.mask_emb", "mask_emb"),
        *[(f"{layer}.attn.{p}.weight", f"{hf}.rel_attn.{p}", proj) for p in "qkv"],
        (f"{layer}.attn.o.weight", f"{hf}.rel_attn.o", out),
        (f"{layer}.attn.xl.r.weight", f"{hf}.rel_attn.r", proj),
        *[(f"{layer}.attn.xl.{p}", f"{hf}.rel_attn.{p}") for p in ("r_w_bias", "r_r_bias", "r_s_bias", "seg_embed")],
        (f"{layer}.attn_norm", f"{hf}.rel_attn.layer_norm"),
        (f"{layer}.ffn.up", f"{hf}.ff.layer_1"), (f"{layer}.ffn.down", f"{hf}.ff.layer_2"),
        (f"{layer}.ffn_norm", f"{hf}.ff.layer_norm"),
    ]


def _family() -> Family:
    from ..heads import PermutationLM
    from ..models.encoder import Encoder
    return Family(model_type="xlnet", config_from_hf=xlnet_config_from_hf, config_to_hf=xlnet_config_to_hf,
                  backbone_rows=xlnet_rows, backbone_prefix="transformer.",
                  architectures={"XLNetModel": (Encoder, []), "XLNetLMHeadModel": (PermutationLM, [("lm_head", "lm_loss")])},
                  default_architecture="XLNetModel")


register(_family())
