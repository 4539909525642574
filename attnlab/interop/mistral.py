"""Mistral 7B (Jiang et al. 2023) in the Hugging Face layout: MistralModel / MistralForCausalLM.

LLaMA with sliding-window attention (§2): every layer's query at position i sees the keys at i - W < j <= i,
so information still travels W tokens per layer (W x L in all), while a decoding step attends over at most
W keys and the KV cache rolls, holding W - 1 (attnlab.inference.kv_cache). Same state-dict names as LLaMA;
the window is our `sliding_window` switch (HF's `kv_idx > q_idx - sliding_window` is our |q - k| < W).
"""
from __future__ import annotations

from ..config import ConfigError, ModelConfig
from .llama import LLAMA_BACKBONE, LLAMA_LM_HEAD, llama_config_from_hf, llama_config_to_hf
from .registry import Family, register


def mistral_config_from_hf(hf: dict, source: str = "config.json", model_type: str = "mistral",
                           consumed: tuple[str, ...] = ()) -> ModelConfig:
    """LLaMA's mapping plus the window; `consumed` keys (a descendant family's own) are left to the caller."""
    window = hf.get("sliding_window")
    if window is not None and (type(window) is not int or window <= 0):
        raise ConfigError(f"{source}: sliding_window={window!r} must be a positive integer or null")
    rest = {k: v for k, v in hf.items() if k not in ("sliding_window", "max_window_layers", *consumed)}
    if hf.get("use_sliding_window") is False:  # Qwen2-style configs: a window that is switched off
        window = None
    return llama_config_from_hf(rest, source).replace(model_type=model_type, sliding_window=window)


def mistral_config_to_hf(cfg: ModelConfig) -> dict:
    out = llama_config_to_hf(cfg)
    out.update(model_type=cfg.model_type, sliding_window=cfg.sliding_window)
    for key in ("attention_bias", "mlp_bias"):  # not MistralConfig fields
        out.pop(key, None)
    return out


def _family() -> Family:
    from ..models.decoder import CausalLM
    from ..models.encoder import Encoder
    return Family(
        model_type="mistral", config_from_hf=mistral_config_from_hf, config_to_hf=mistral_config_to_hf,
        backbone_rows=LLAMA_BACKBONE, backbone_prefix="model.",
        architectures={"MistralModel": (Encoder, []), "MistralForCausalLM": (CausalLM, LLAMA_LM_HEAD)},
        default_architecture="MistralForCausalLM")


register(_family())
