"""LLaMA-style decoders (Touvron et al. 2023; SmolLM2, TinyLlama, ...) in the Hugging Face layout:
LlamaModel / LlamaForCausalLM.

Our `Encoder` with RMSNorm, pre-norm, SwiGLU, RoPE (rotate-half layout, configurable theta), no biases,
no embedding norm and grouped-query attention through `num_kv_heads`.
"""
from __future__ import annotations

from ..config import ConfigError, ModelConfig
from .registry import Family, Row, config_from_mapping, register

_RENAMES = {
    "vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_heads", "num_key_value_heads": "num_kv_heads", "head_dim": "head_dim",
    "intermediate_size": "intermediate_size", "max_position_embeddings": "max_position_embeddings",
    "rms_norm_eps": "norm_eps", "attention_dropout": "attention_dropout",
    "initializer_range": "initializer_range", "bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id",
    "pad_token_id": "pad_token_id",
}


def rope_theta_from_hf(hf: dict, source: str) -> float:
    """transformers >= 5 keeps theta in `rope_parameters`, older configs in `rope_theta`/`rope_scaling`."""
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise ConfigError(f"{source}: rope_type={kind!r} (RoPE scaling) is not supported; only 'default'")
    return float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))


def llama_config_from_hf(hf: dict, source: str = "config.json") -> ModelConfig:
    act = hf.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ConfigError(f"{source}: hidden_act={act!r} is not supported for llama (only 'silu': SwiGLU)")
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        raise ConfigError(f"{source}: attention_bias/mlp_bias=true is not supported (LLaMA has no biases)")
    if hf.get("pretraining_tp", 1) not in (1, None):
        raise ConfigError(f"{source}: pretraining_tp={hf['pretraining_tp']} is not supported (only 1)")
    fixed = dict(model_type="llama", causal=True, position="rope", norm="rmsnorm", norm_placement="pre",
                 activation="swiglu", embedding_norm=False, final_norm=True, pooler=False, type_vocab_size=0,
                 bias=False, dropout=0.0, norm_eps=1e-6, pad_token_id=None,
                 rope_theta=rope_theta_from_hf(hf, source), max_position_embeddings=2048,
                 tie_word_embeddings=hf.get("tie_word_embeddings", False))
    hf = {k: v for k, v in hf.items() if not (k == "head_dim" and v is None)}
    return config_from_mapping(hf, source, _RENAMES, fixed, {
        "hidden_act", "attention_bias", "mlp_bias", "rope_theta", "rope_parameters", "rope_scaling",
        "tie_word_embeddings", "pretraining_tp", "use_cache"})


def llama_config_to_hf(cfg: ModelConfig) -> dict:
    out = dict(cfg.extra)
    out.update({theirs: getattr(cfg, ours) for theirs, ours in _RENAMES.items()})
    out.update(model_type="llama", hidden_act="silu", attention_bias=False, mlp_bias=False,
               num_key_value_heads=cfg.kv_heads, head_dim=cfg.dim_head,
               rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
               rope_theta=cfg.rope_theta,  # for transformers 4.x readers
               tie_word_embeddings=cfg.tie_word_embeddings)
    return out


LLAMA_BACKBONE: list[Row] = [
    ("embeddings.tok", "embed_tokens"),
    ("layers.{i}.attn_norm", "layers.{i}.input_layernorm"),
    ("layers.{i}.attn.q", "layers.{i}.self_attn.q_proj"),
    ("layers.{i}.attn.k", "layers.{i}.self_attn.k_proj"),
    ("layers.{i}.attn.v", "layers.{i}.self_attn.v_proj"),
    ("layers.{i}.attn.o", "layers.{i}.self_attn.o_proj"),
    ("layers.{i}.ffn_norm", "layers.{i}.post_attention_layernorm"),
    ("layers.{i}.ffn.gate", "layers.{i}.mlp.gate_proj"),
    ("layers.{i}.ffn.up", "layers.{i}.mlp.up_proj"),
    ("layers.{i}.ffn.down", "layers.{i}.mlp.down_proj"),
    ("final_norm", "norm"),
]
LLAMA_LM_HEAD: list[Row] = [("lm_head", "lm_head")]


def _family() -> Family:
    from ..models.decoder import CausalLM
    from ..models.encoder import Encoder
    return Family(
        model_type="llama", config_from_hf=llama_config_from_hf, config_to_hf=llama_config_to_hf,
        backbone_rows=LLAMA_BACKBONE, backbone_prefix="model.",
        architectures={"LlamaModel": (Encoder, []), "LlamaForCausalLM": (CausalLM, LLAMA_LM_HEAD)},
        default_architecture="LlamaForCausalLM",
        ignore=tuple(f"layers.{i}.self_attn.rotary_emb.inv_freq" for i in range(256)))


register(_family())
