"""GPT-2 (Radford et al. 2019) in the Hugging Face layout: GPT2Model / GPT2LMHeadModel.

GPT-2 is our `Encoder` with learned positions, pre-LN, GELU-tanh, no embedding LayerNorm, a final
LayerNorm, no token types and no pooler. Two quirks of its checkpoints are handled by the table:
`c_attn` holds Q, K and V fused in one tensor (a tuple row), and its `Conv1D` layers store weights as
(in, out), the transpose of `nn.Linear` ("T").
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
_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}


def gpt2_config_from_hf(hf: dict, source: str = "config.json") -> ModelConfig:
    act = hf.get("activation_function", "gelu_new")
    if act not in _ACTIVATIONS:
        raise ConfigError(f"{source}: activation_function={act!r} is not supported; "
                          f"supported: {', '.join(_ACTIVATIONS)}")
    for key in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention"):
        if hf.get(key):
            raise ConfigError(f"{source}: {key}=true is not supported")
    if hf.get("scale_attn_weights", True) is False:
        raise ConfigError(f"{source}: scale_attn_weights=false is not supported")
    n_embd = hf.get("n_embd", 768)
    fixed = dict(model_type="gpt2", causal=True, position="learned", norm="layernorm", norm_placement="pre",
                 activation=_ACTIVATIONS[act], embedding_norm=False, final_norm=True, pooler=False,
                 type_vocab_size=0, bias=True, pad_token_id=None,
                 intermediate_size=hf.get("n_inner") or 4 * n_embd,
                 tie_word_embeddings=hf.get("tie_word_embeddings", True))
    return config_from_mapping(hf, source, _RENAMES, fixed, {"activation_function", "n_inner",
                                                             "tie_word_embeddings", "n_ctx"})


def gpt2_config_to_hf(cfg: ModelConfig) -> dict:
    out = dict(cfg.extra)
    out.update({theirs: getattr(cfg, ours) for theirs, ours in _RENAMES.items()})
    act = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}.get(cfg.activation)
    if act is None:
        raise ConfigError(f"config: activation={cfg.activation!r} has no GPT-2 equivalent")
    out.update(model_type="gpt2", activation_function=act, n_inner=cfg.intermediate_size,
               n_ctx=cfg.max_position_embeddings, tie_word_embeddings=cfg.tie_word_embeddings)
    return out


GPT2_BACKBONE: list[Row] = [
    ("embeddings.tok", "wte"),
    ("embeddings.pos", "wpe"),
    ("layers.{i}.attn_norm", "h.{i}.ln_1"),
    (("layers.{i}.attn.q", "layers.{i}.attn.k", "layers.{i}.attn.v"), "h.{i}.attn.c_attn", "T"),
    ("layers.{i}.attn.o", "h.{i}.attn.c_proj", "T"),
    ("layers.{i}.ffn_norm", "h.{i}.ln_2"),
    ("layers.{i}.ffn.up", "h.{i}.mlp.c_fc", "T"),
    ("layers.{i}.ffn.down", "h.{i}.mlp.c_proj", "T"),
    ("final_norm", "ln_f"),
]
GPT2_LM_HEAD: list[Row] = [("lm_head", "lm_head")]


def _family() -> Family:
    from ..models.decoder import CausalLM
    from ..models.encoder import Encoder
    return Family(
        model_type="gpt2", config_from_hf=gpt2_config_from_hf, config_to_hf=gpt2_config_to_hf,
        backbone_rows=GPT2_BACKBONE, backbone_prefix="transformer.",
        architectures={"GPT2Model": (Encoder, []), "GPT2LMHeadModel": (CausalLM, GPT2_LM_HEAD)},
        default_architecture="GPT2LMHeadModel",
        # old checkpoints carry the causal mask as a buffer per layer; it holds no weights
        ignore=tuple(f"h.{i}.attn.{b}" for i in range(128) for b in ("bias", "masked_bias")))


register(_family())
