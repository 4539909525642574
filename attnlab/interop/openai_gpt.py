"""GPT-1 (Radford et al. 2018, "Improving Language Understanding by Generative Pre-Training") in the Hugging
Face layout: OpenAIGPTModel / OpenAIGPTLMHeadModel.

GPT-1 is the original post-LN Transformer block (LN(x + f(x)), as BERT) used as a causal decoder: learned
positions, GELU (the tanh form), no embedding LayerNorm and no final LayerNorm, the output projection tied
to the token embeddings. Its checkpoints store Q, K, V fused in `c_attn` and (in, out) `Conv1D` weights, as
GPT-2's do, so the table reuses those row kinds.
"""
from __future__ import annotations

from ..config import ConfigError, ModelConfig
from .registry import Family, Row, config_from_mapping, register

_RENAMES = {
    "vocab_size": "vocab_size", "n_embd": "hidden_size", "n_layer": "num_layers", "n_head": "num_heads",
    "n_positions": "max_position_embeddings", "layer_norm_epsilon": "norm_eps", "resid_pdrop": "dropout",
    "attn_pdrop": "attention_dropout", "initializer_range": "initializer_range",
    "bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id", "pad_token_id": "pad_token_id",
}
# transformers' OpenAIGPT "gelu" is the tanh approximation (its gelu_new)
_ACTIVATIONS = {"gelu": "gelu_tanh", "relu": "relu", "silu": "silu", "swish": "silu"}


def openai_gpt_config_from_hf(hf: dict, source: str = "config.json") -> ModelConfig:
    act = hf.get("afn", "gelu")
    if act not in _ACTIVATIONS:
        raise ConfigError(f"{source}: afn={act!r} is not supported; supported: {', '.join(_ACTIVATIONS)}")
    n_embd = hf.get("n_embd", 768)
    fixed = dict(model_type="openai-gpt", causal=True, position="learned", norm="layernorm", norm_placement="post",
                 activation=_ACTIVATIONS[act], embedding_norm=False, final_norm=False, pooler=False,
                 type_vocab_size=0, bias=True, pad_token_id=None, norm_eps=1e-5, intermediate_size=4 * n_embd,
                 max_position_embeddings=512, vocab_size=40478, tie_word_embeddings=hf.get("tie_word_embeddings", True))
    return config_from_mapping(hf, source, _RENAMES, fixed, {"afn", "tie_word_embeddings", "embd_pdrop"})


def openai_gpt_config_to_hf(cfg: ModelConfig) -> dict:
    if cfg.intermediate_size != 4 * cfg.hidden_size:
        raise ConfigError(f"config: intermediate_size={cfg.intermediate_size} cannot be expressed in a GPT-1 "
                          f"checkpoint (always 4 * n_embd = {4 * cfg.hidden_size})")
    act = {"gelu_tanh": "gelu", "relu": "relu", "silu": "silu"}.get(cfg.activation)
    if act is None:
        raise ConfigError(f"config: activation={cfg.activation!r} has no GPT-1 equivalent")
    out = dict(cfg.extra)
    out.update({theirs: getattr(cfg, ours) for theirs, ours in _RENAMES.items()})
    out.update(model_type="openai-gpt", afn=act, embd_pdrop=cfg.dropout, tie_word_embeddings=cfg.tie_word_embeddings)
    return out


OPENAI_GPT_BACKBONE: list[Row] = [
    ("embeddings.tok", "tokens_embed"),
    ("embeddings.pos", "positions_embed"),
    (("layers.{i}.attn.q", "layers.{i}.attn.k", "layers.{i}.attn.v"), "h.{i}.attn.c_attn", "T"),
    ("layers.{i}.attn.o", "h.{i}.attn.c_proj", "T"),
    ("layers.{i}.attn_norm", "h.{i}.ln_1"),   # post-LN: after the attention residual
    ("layers.{i}.ffn.up", "h.{i}.mlp.c_fc", "T"),
    ("layers.{i}.ffn.down", "h.{i}.mlp.c_proj", "T"),
    ("layers.{i}.ffn_norm", "h.{i}.ln_2"),
]
OPENAI_GPT_LM_HEAD: list[Row] = [("lm_head", "lm_head")]


def _family() -> Family:
    from ..models.decoder import CausalLM
    from ..models.encoder import Encoder
    return Family(
        model_type="openai-gpt", config_from_hf=openai_gpt_config_from_hf, config_to_hf=openai_gpt_config_to_hf,
        backbone_rows=OPENAI_GPT_BACKBONE, backbone_prefix="transformer.",
        architectures={"OpenAIGPTModel": (Encoder, []), "OpenAIGPTLMHeadModel": (CausalLM, OPENAI_GPT_LM_HEAD)},
        default_architecture="OpenAIGPTLMHeadModel",
        # the causal mask and position ids are buffers in some checkpoints; they hold no weights
        ignore=("position_ids",) + tuple(f"h.{i}.attn.bias" for i in range(128)))


register(_family())
