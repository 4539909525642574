"""XLM (Lample & Conneau 2019) in the Hugging Face layout: XLMModel / XLMWithLMHeadModel.

XLM is BERT's post-LN encoder with three differences, all switches of the one config:
- a language embedding added to every token (§3.1, Figure 1): `num_languages` (HF `n_langs` with
  `use_lang_emb`), chosen per token by `langs`; with one language HF builds no table, nor do we;
- no segment embeddings (type_vocab_size 0) and no pooler; the FFN is 4 x emb_dim, GELU or ReLU;
- positions learned, or fixed sinusoids (`sinusoidal_embeddings`, the same interleaved sin/cos table as
  Vaswani et al. §3.5): HF keeps them as frozen `position_embeddings.weight`, we as the sinusoid buffer, so
  a save writes the table and a load ignores it.
The LM head (`pred_layer.proj`) is one projection tied to the input embeddings plus a bias, without BERT's
dense + LayerNorm transform (`extra.head_transform: false`).

Not covered: XLM's causal (CLM) and adaptive-softmax (asm) variants, and its `token_type_ids`, which HF
looks up in the word embedding table (ours: none, type_vocab_size 0). Such configs are refused.
"""
from __future__ import annotations

from ..config import ConfigError, ModelConfig
from ..nn.positions import sinusoidal_table
from .registry import Family, Row, config_from_mapping, register

XLM_RENAMES = {
    "vocab_size": "vocab_size", "emb_dim": "hidden_size", "n_layers": "num_layers", "n_heads": "num_heads",
    "max_position_embeddings": "max_position_embeddings", "dropout": "dropout",
    "attention_dropout": "attention_dropout", "init_std": "initializer_range", "layer_norm_eps": "norm_eps",
    "pad_token_id": "pad_token_id", "bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id",
}
# old XLM config.json files spell some keys the original way (transformers' attribute_map)
XLM_ALIASES = {"n_words": "vocab_size", "pad_index": "pad_token_id", "bos_index": "bos_token_id",
               "eos_index": "eos_token_id", "hidden_size": "emb_dim", "num_attention_heads": "n_heads",
               "num_hidden_layers": "n_layers"}


def xlm_config_from_hf(hf: dict, source: str = "config.json") -> ModelConfig:
    hf = dict(hf)
    for old, new in XLM_ALIASES.items():
        if old in hf:
            value = hf.pop(old)
            hf.setdefault(new, value)
    for key, why in (("causal", "causal (CLM) XLM"), ("asm", "the adaptive softmax head (asm)")):
        if hf.get(key):
            raise ConfigError(f"{source}: {key}=true is not supported ({why})")
    if not hf.get("is_encoder", True):
        raise ConfigError(f"{source}: is_encoder=false is not supported (transformers' XLM is an encoder only)")
    n_langs, use = hf.get("n_langs", 1), hf.get("use_lang_emb", True)
    if not isinstance(n_langs, int) or isinstance(n_langs, bool) or n_langs < 1:
        raise ConfigError(f"{source}: n_langs={n_langs!r} must be a positive integer")
    dim = hf.get("emb_dim", 2048)
    if not isinstance(dim, int) or isinstance(dim, bool) or dim <= 0:
        raise ConfigError(f"{source}: emb_dim={dim!r} must be a positive integer")
    fixed = dict(model_type="xlm", vocab_size=30145, hidden_size=2048, num_layers=12, num_heads=16,
                 intermediate_size=4 * dim,  # XLM's FFN is always 4 x emb_dim
                 activation="gelu" if hf.get("gelu_activation", True) else "relu",
                 position="sinusoidal" if hf.get("sinusoidal_embeddings") else "learned",
                 num_languages=n_langs if use and n_langs > 1 else 0, type_vocab_size=0, pooler=False,
                 tie_word_embeddings=hf.get("tie_word_embeddings", True), pad_token_id=2, bos_token_id=0,
                 eos_token_id=1, initializer_range=0.02)
    cfg = config_from_mapping(hf, source, XLM_RENAMES, fixed,
                              {"gelu_activation", "sinusoidal_embeddings", "causal", "asm", "n_langs",
                               "use_lang_emb", "tie_word_embeddings", "is_encoder"})
    cfg.extra.update(head_transform=False)
    cfg.extra.setdefault("n_langs", n_langs)  # kept: a one-language XLM has no table but still says so
    return cfg


def xlm_config_to_hf(cfg: ModelConfig) -> dict:
    out = {k: v for k, v in cfg.extra.items() if k not in ("head_transform", "n_langs")}
    out.update({theirs: getattr(cfg, ours) for theirs, ours in XLM_RENAMES.items()})
    out.update(model_type="xlm", gelu_activation=cfg.activation == "gelu",
               sinusoidal_embeddings=cfg.position == "sinusoidal", causal=False, asm=False, is_encoder=True,
               n_langs=cfg.num_languages or int(cfg.extra.get("n_langs", 1)), use_lang_emb=True,
               tie_word_embeddings=cfg.tie_word_embeddings)
    if cfg.num_languages == 0 and out["n_langs"] > 1:
        out["use_lang_emb"] = False
    return out


XLM_BACKBONE: list[Row] = [
    ("embeddings.tok", "embeddings"),
    ("embeddings.pos", "position_embeddings"),
    ("embeddings.lang", "lang_embeddings"),
    ("embeddings.norm", "layer_norm_emb"),
    ("layers.{i}.attn.q", "attentions.{i}.q_lin"),
    ("layers.{i}.attn.k", "attentions.{i}.k_lin"),
    ("layers.{i}.attn.v", "attentions.{i}.v_lin"),
    ("layers.{i}.attn.o", "attentions.{i}.out_lin"),
    ("layers.{i}.attn_norm", "layer_norm1.{i}"),
    ("layers.{i}.ffn.up", "ffns.{i}.lin1"),
    ("layers.{i}.ffn.down", "ffns.{i}.lin2"),
    ("layers.{i}.ffn_norm", "layer_norm2.{i}"),
]
# the bias row first: "pred_layer.proj" would otherwise claim pred_layer.proj.bias as mlm.decoder.bias
XLM_LM: list[Row] = [("mlm.bias", "pred_layer.proj.bias"), ("mlm.decoder", "pred_layer.proj")]


def _ignore(cfg: ModelConfig) -> tuple[str, ...]:
    """HF buffers; and with sinusoids, their frozen table (ours is recomputed, the same numbers)."""
    return ("position_ids",) + (("position_embeddings.weight",) if cfg.position == "sinusoidal" else ())


def _save_sinusoids(model, tensors: dict) -> None:
    """transformers stores the fixed table as weights: write ours under its name."""
    cfg = model.config
    if cfg.position != "sinusoidal":
        return
    prefix = "transformer." if hasattr(model, "backbone") else ""
    tensors[prefix + "position_embeddings.weight"] = sinusoidal_table(cfg.max_position_embeddings, cfg.emb_size)


def _family() -> Family:
    from ..heads import MaskedLM
    from ..models.encoder import Encoder
    return Family(model_type="xlm", config_from_hf=xlm_config_from_hf, config_to_hf=xlm_config_to_hf,
                  backbone_rows=XLM_BACKBONE, backbone_prefix="transformer.",
                  architectures={"XLMModel": (Encoder, []), "XLMWithLMHeadModel": (MaskedLM, XLM_LM)},
                  default_architecture="XLMModel", ignore=_ignore, extra_save=_save_sinusoids)


register(_family())
