"""GPT-NeoX (Black et al. 2022, "GPT-NeoX-20B"; also Pythia) in the Hugging Face layout: GPTNeoXModel /
GPTNeoXForCausalLM.

Pre-LN with two switches of its own: rotary positions on only the first `rotary_pct` of each head's
dimensions (`rotary_fraction`, 0.25 in GPT-NeoX-20B and Pythia, §2.1) and, with `use_parallel_residual`, the
attention and feed-forward sublayers computed from the same input and added together (`parallel_residual`,
from GPT-J: x + attn(LN1 x) + ffn(LN2 x), §2.1). Exact-erf GELU, untied output projection `embed_out`.
Its `query_key_value` holds Q, K and V fused head by head; `HeadInterleave` regroups the rows.
"""
from __future__ import annotations

from ..config import ConfigError, ModelConfig
from .names import HeadInterleave
from .registry import Family, Row, config_from_mapping, hf_activation, register

_RENAMES = {
    "vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_heads", "intermediate_size": "intermediate_size",
    "max_position_embeddings": "max_position_embeddings", "layer_norm_eps": "norm_eps", "hidden_dropout": "dropout",
    "attention_dropout": "attention_dropout", "initializer_range": "initializer_range",
    "bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id", "pad_token_id": "pad_token_id",
}


def gpt_neox_config_from_hf(hf: dict, source: str = "config.json") -> ModelConfig:
    # transformers >= 5 keeps theta and the rotary share in `rope_parameters`; older files in rotary_*
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise ConfigError(f"{source}: rope_type={kind!r} (RoPE scaling) is not supported; only 'default'")
    theta = float(params.get("rope_theta", hf.get("rotary_emb_base", 10000.0)))
    fraction = float(params.get("partial_rotary_factor", hf.get("rotary_pct", 0.25)))
    bias = hf.get("attention_bias", True)
    if bias is not True:
        raise ConfigError(f"{source}: attention_bias={bias!r} is not supported (only true: attnlab switches the "
                          "Q/K/V biases alone, GPT-NeoX's flag also drops the output projection's)")
    fixed = dict(model_type="gpt_neox", causal=True, position="rope", norm="layernorm", norm_placement="pre",
                 activation=hf_activation(hf.get("hidden_act", "gelu"), source), embedding_norm=False,
                 final_norm=True, pooler=False, type_vocab_size=0, bias=True,
                 rope_theta=theta, rotary_fraction=fraction,
                 parallel_residual=bool(hf.get("use_parallel_residual", True)), norm_eps=1e-5, dropout=0.0,
                 attention_dropout=0.0, pad_token_id=None, max_position_embeddings=2048,
                 tie_word_embeddings=hf.get("tie_word_embeddings", False))
    return config_from_mapping(hf, source, _RENAMES, fixed, {
        "hidden_act", "rope_parameters", "rope_scaling", "rotary_emb_base", "rotary_pct", "rope_theta",
        "partial_rotary_factor", "use_parallel_residual", "attention_bias", "tie_word_embeddings", "use_cache"})


def gpt_neox_config_to_hf(cfg: ModelConfig) -> dict:
    act = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}.get(cfg.activation)
    if act is None:
        raise ConfigError(f"config: activation={cfg.activation!r} has no GPT-NeoX equivalent")
    out = dict(cfg.extra)
    out.update({theirs: getattr(cfg, ours) for theirs, ours in _RENAMES.items()})
    out.update(model_type="gpt_neox", hidden_act=act, use_parallel_residual=cfg.parallel_residual,
               attention_bias=True, tie_word_embeddings=cfg.tie_word_embeddings,
               rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta,
                                "partial_rotary_factor": cfg.rotary_fraction},
               rotary_pct=cfg.rotary_fraction, rotary_emb_base=cfg.rope_theta)  # for transformers 4.x readers
    return out


def gpt_neox_backbone(cfg: ModelConfig) -> list[Row]:
    return [
        ("embeddings.tok", "embed_in"),
        ("layers.{i}.attn_norm", "layers.{i}.input_layernorm"),
        (("layers.{i}.attn.q", "layers.{i}.attn.k", "layers.{i}.attn.v"), "layers.{i}.attention.query_key_value",
         HeadInterleave(cfg.num_heads)),
        ("layers.{i}.attn.o", "layers.{i}.attention.dense"),
        ("layers.{i}.ffn_norm", "layers.{i}.post_attention_layernorm"),
        ("layers.{i}.ffn.up", "layers.{i}.mlp.dense_h_to_4h"),
        ("layers.{i}.ffn.down", "layers.{i}.mlp.dense_4h_to_h"),
        ("final_norm", "final_layer_norm"),
    ]


# embed_out sits beside the backbone, not inside gpt_neox.
GPT_NEOX_LM_HEAD: list[Row] = [("lm_head", "embed_out")]


def _family() -> Family:
    from ..models.decoder import CausalLM
    from ..models.encoder import Encoder
    return Family(
        model_type="gpt_neox", config_from_hf=gpt_neox_config_from_hf, config_to_hf=gpt_neox_config_to_hf,
        backbone_rows=gpt_neox_backbone, backbone_prefix="gpt_neox.",
        architectures={"GPTNeoXModel": (Encoder, []), "GPTNeoXForCausalLM": (CausalLM, GPT_NEOX_LM_HEAD)},
        default_architecture="GPTNeoXForCausalLM",
        ignore=tuple(f"layers.{i}.attention.{b}" for i in range(256)
                     for b in ("bias", "masked_bias", "rotary_emb.inv_freq")))


register(_family())
