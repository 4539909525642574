"""The family registry: one `Family` per Hugging Face `model_type`, registered by its own module.

A family says how its config.json maps onto `ModelConfig` and how its state-dict names map onto ours
(`names.NameTable` rows), and which attnlab class serves each HF architecture name. A new family is one
module that builds a `Family` and calls `register`, plus one import line in `interop/__init__.py`.

Registering also tells the models layer (which never imports this one) the family's architecture names,
so that one class, e.g. `MaskedLM`, calls itself BertForMaskedLM or DistilBertForMaskedLM by its config.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

from ..config import ConfigError, ModelConfig
from ..models.base import ARCHITECTURES, Model

Row = tuple  # (ours: str | tuple[str, ...], theirs: str[, transform: str]); see names.NameTable


@dataclass
class Family:
    model_type: str
    config_from_hf: Callable[[dict], ModelConfig]
    config_to_hf: Callable[[ModelConfig], dict]
    backbone_rows: list[Row] | Callable[[ModelConfig], list[Row]]  # a function of the config if the layout needs one
    backbone_prefix: str                         # where HF head models keep the backbone ("bert.")
    architectures: dict[str, tuple[type, list[Row]]] = field(default_factory=dict)  # name -> (class, head rows)
    default_architecture: str = ""
    # HF keys that carry no weights we need (buffers); a function of the config if that decides (XLM's sinusoids)
    ignore: tuple[str, ...] | Callable[[ModelConfig], tuple[str, ...]] = ()
    # HF keys with no counterpart here that may be absent from a checkpoint yet must be present in a save
    # for transformers to load it cleanly are produced by this hook
    extra_save: Callable[[Model, dict], None] | None = None

    def architecture_for(self, cls: type) -> str | None:
        """The first HF architecture name this family serves with `cls` (None: the class is not one of its)."""
        return next((name for name, (c, _) in self.architectures.items() if c is cls), None)


FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    FAMILIES[family.model_type] = family
    ARCHITECTURES[family.model_type] = {name: cls for name, (cls, _) in family.architectures.items()}
    return family


def family_of(model_type: str, source: str) -> Family:
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        raise ConfigError(f"{source}: model_type={model_type!r} is not supported; supported: {', '.join(sorted(FAMILIES))}")
    return FAMILIES[model_type]


# ----------------------------------------------------------------------------------- config helpers
def config_from_mapping(hf: dict, source: str, renames: dict[str, str], fixed: dict[str, Any],
                        consumed: set[str]) -> ModelConfig:
    """Build a ModelConfig from an HF config dict: `renames` maps HF key -> our field, `fixed` are values
    the family implies, every other HF key is kept in `extra` so that a save writes it back."""
    values = dict(fixed)
    for theirs, ours in renames.items():
        if theirs in hf and hf[theirs] is not None:
            values[ours] = hf[theirs]
    skip = set(renames) | consumed | {"architectures", "model_type", "transformers_version", "dtype", "torch_dtype"}
    values["extra"] = {k: v for k, v in hf.items() if k not in skip}
    try:
        return ModelConfig.from_dict(values, source=source)
    except ConfigError as err:
        msg = str(err)
        for theirs, ours in renames.items():  # speak the file's language: its own key names
            msg = re.sub(rf"\b{ours}=", f"{theirs}=", msg)
        raise ConfigError(msg) from None




HF_ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                  "silu": "silu", "swish": "silu", "leaky_relu": "leaky_relu"}


def hf_activation(name: str, source: str) -> str:
    if name not in HF_ACTIVATIONS:
        raise ConfigError(f"{source}: hidden_act={name!r} is not supported; supported: {', '.join(HF_ACTIVATIONS)}")
    return HF_ACTIVATIONS[name]
