"""ELECTRA (Clark et al. 2020) in the Hugging Face layout: ElectraModel, ElectraForPreTraining (the
discriminator) and ElectraForMaskedLM (the generator).

Both networks are our `Encoder` with BERT's blocks: ELECTRA changes the objective, not the architecture
(§2, replaced-token detection; attnlab.objectives.electra trains the pair). Differences in layout:
- the embeddings may be smaller than the hidden size and are projected up (`embeddings_project`), which
  lets the small generator share the discriminator's embeddings (§3.2);
- no pooler; the discriminator's head is `discriminator_predictions` (dense, activation, one logit);
- the generator's MLM head predicts in embedding space with a fixed GELU (`generator_predictions`,
  `generator_lm_head`).
"""
from __future__ import annotations

from ..config import ConfigError, ModelConfig
from .bert import BERT_BACKBONE, BERT_RENAMES
from .registry import Family, Row, config_from_mapping, hf_activation, register

_RENAMES = dict(BERT_RENAMES, embedding_size="embedding_size")
_ACT_BACK = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}
OURS_ONLY = ("head_activation",)


def electra_config_from_hf(hf: dict, source: str = "config.json") -> ModelConfig:
    pos = hf.get("position_embedding_type", "absolute")
    if pos != "absolute":
        raise ConfigError(f"{source}: position_embedding_type={pos!r} is not supported (only 'absolute')")
    if hf.get("is_decoder") or hf.get("add_cross_attention"):
        raise ConfigError(f"{source}: ELECTRA as a decoder (is_decoder/add_cross_attention) is not supported")
    fixed = dict(model_type="electra", activation=hf_activation(hf.get("hidden_act", "gelu"), source),
                 pooler=False, embedding_size=hf.get("embedding_size", 128),
                 tie_word_embeddings=hf.get("tie_word_embeddings", True))
    cfg = config_from_mapping(hf, source, _RENAMES, fixed,
                              {"hidden_act", "position_embedding_type", "tie_word_embeddings"})
    cfg.extra["head_activation"] = "gelu"  # generator_predictions uses GELU whatever hidden_act says
    return cfg


def electra_config_to_hf(cfg: ModelConfig) -> dict:
    if cfg.activation not in _ACT_BACK:
        raise ConfigError(f"config: activation={cfg.activation!r} has no ELECTRA equivalent")
    out = {k: v for k, v in cfg.extra.items() if k not in OURS_ONLY}
    out.update({theirs: getattr(cfg, ours) for theirs, ours in _RENAMES.items()})
    out.update(model_type="electra", hidden_act=_ACT_BACK[cfg.activation], embedding_size=cfg.emb_size,
               position_embedding_type="absolute", tie_word_embeddings=cfg.tie_word_embeddings)
    return out


# BERT's names for embeddings and blocks, plus the projection from the factorized embedding size E to
# H (Clark et al. 2020, §3.2: the generator shares the discriminator's embeddings); no pooler.
ELECTRA_BACKBONE: list[Row] = [row for row in BERT_BACKBONE if row[0] != "pooler.dense"] + [
    ("embeddings.project", "embeddings_project"),
]
ELECTRA_DISCRIMINATOR: list[Row] = [
    ("rtd.dense", "discriminator_predictions.dense"),
    ("rtd.out", "discriminator_predictions.dense_prediction"),
]
ELECTRA_GENERATOR: list[Row] = [
    ("mlm.dense", "generator_predictions.dense"),
    ("mlm.norm", "generator_predictions.LayerNorm"),
    ("mlm.bias", "generator_lm_head.bias"),  # before the decoder row: HF keeps the bias inside the lm head
    ("mlm.decoder", "generator_lm_head"),
]


def _family() -> Family:
    from ..heads import MaskedLM, ReplacedTokenDetection
    from ..models.encoder import Encoder
    return Family(
        model_type="electra", config_from_hf=electra_config_from_hf, config_to_hf=electra_config_to_hf,
        backbone_rows=ELECTRA_BACKBONE, backbone_prefix="electra.",
        architectures={"ElectraModel": (Encoder, []),
                       "ElectraForPreTraining": (ReplacedTokenDetection, ELECTRA_DISCRIMINATOR),
                       "ElectraForMaskedLM": (MaskedLM, ELECTRA_GENERATOR)},
        default_architecture="ElectraModel",
        ignore=("embeddings.position_ids", "embeddings.token_type_ids"))


register(_family())
