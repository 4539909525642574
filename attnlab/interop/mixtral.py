"""Mixtral 8x7B (Jiang et al. 2024) in the Hugging Face layout: MixtralModel / MixtralForCausalLM.

Mistral whose feed-forward is a sparse mixture of 8 SwiGLU experts with top-2 routing (§2.1): our
`num_experts` / `experts_top_k` switches (attnlab.nn.moe). Checkpoints (the Hub's, and what transformers 5
writes, though it stacks the experts in memory) keep one tensor per expert, `block_sparse_moe.experts.{j}.w1`
(gate), `w3` (up), `w2` (down), and the router as `block_sparse_moe.gate`. Outputs carry `router_logits` and `aux_loss` as MixtralForCausalLM
returns them with output_router_logits=True; the loss adds router_aux_loss_coef x aux_loss.
"""
from __future__ import annotations

from ..config import ConfigError, ModelConfig
from .llama import LLAMA_BACKBONE, LLAMA_LM_HEAD
from .mistral import mistral_config_from_hf, mistral_config_to_hf
from .registry import Family, register

_MOE_KEYS = ("num_local_experts", "num_experts_per_tok", "router_aux_loss_coef", "router_jitter_noise",
             "output_router_logits")


def mixtral_config_from_hf(hf: dict, source: str = "config.json") -> ModelConfig:
    experts, top_k = hf.get("num_local_experts", 8), hf.get("num_experts_per_tok", 2)
    if type(experts) is not int or experts < 2:
        raise ConfigError(f"{source}: num_local_experts={experts!r} must be an integer >= 2")
    if type(top_k) is not int or not 1 <= top_k <= experts:
        raise ConfigError(f"{source}: num_experts_per_tok={top_k!r} must be an integer in [1, {experts}]")
    if hf.get("router_jitter_noise", 0.0):
        raise ConfigError(f"{source}: router_jitter_noise={hf['router_jitter_noise']!r} is not supported (only 0)")
    cfg = mistral_config_from_hf(hf, source, "mixtral", consumed=_MOE_KEYS)
    return cfg.replace(num_experts=experts, experts_top_k=top_k,
                       router_aux_loss_coef=float(hf.get("router_aux_loss_coef", 0.001)))


def mixtral_config_to_hf(cfg: ModelConfig) -> dict:
    out = mistral_config_to_hf(cfg)
    out.update(num_local_experts=cfg.num_experts, num_experts_per_tok=cfg.experts_top_k,
               router_aux_loss_coef=cfg.router_aux_loss_coef, router_jitter_noise=0.0)
    return out


_DENSE_FFN = ("layers.{i}.ffn.gate", "layers.{i}.ffn.up", "layers.{i}.ffn.down")
MIXTRAL_BACKBONE = [row for row in LLAMA_BACKBONE if row[0] not in _DENSE_FFN] + [
    ("layers.{i}.ffn.router", "layers.{i}.block_sparse_moe.gate"),
    ("layers.{i}.ffn.experts.{j}.gate", "layers.{i}.block_sparse_moe.experts.{j}.w1"),
    ("layers.{i}.ffn.experts.{j}.up", "layers.{i}.block_sparse_moe.experts.{j}.w3"),
    ("layers.{i}.ffn.experts.{j}.down", "layers.{i}.block_sparse_moe.experts.{j}.w2"),
]


def _family() -> Family:
    from ..models.decoder import CausalLM
    from ..models.encoder import Encoder
    return Family(
        model_type="mixtral", config_from_hf=mixtral_config_from_hf, config_to_hf=mixtral_config_to_hf,
        backbone_rows=MIXTRAL_BACKBONE, backbone_prefix="model.",
        architectures={"MixtralModel": (Encoder, []), "MixtralForCausalLM": (CausalLM, LLAMA_LM_HEAD)},
        default_architecture="MixtralForCausalLM")


register(_family())
