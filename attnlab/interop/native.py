"""attnlab's own checkpoint layout, for models no Hugging Face table describes (a pre-LN BERT, a
bias-free GPT-2, ELECTRA's generator + discriminator pair):

    DIR/attnlab_config.json          ModelConfig.to_dict() + extra["attnlab_class"] (the class to build)
    DIR/attnlab_state.safetensors    our own state-dict names, a tied matrix stored once

`save_model` writes the Hugging Face layout whenever the model's family can express it and falls back to
this one; `load_native` reads it back; `load_model_weights` fills an existing model from either layout.
"""
from __future__ import annotations

import json
from pathlib import Path

from .. import heads  # noqa: F401  (every class attnlab_config.json may name is a Model subclass by now)
from ..config import ConfigError, ModelConfig
from ..models import decoder, rnn, seq2seq  # noqa: F401
from ..models.base import Model
from .files import atomic_write, read_json, read_safetensors, read_state_dict
from .hf import load_hf_state_dict, save_pretrained
from .registry import FAMILIES

RAW_WEIGHTS = "attnlab_state.safetensors"  # our own names, for models no Hugging Face table describes
NATIVE_CONFIG = "attnlab_config.json"


def save_model(model: Model, directory: str | Path) -> Path:
    """Hugging Face layout when the model's family and head are known, else our own tensor names."""
    directory = Path(directory)
    family = FAMILIES.get(model.config.model_type)
    if family is not None and model.hf_architecture in family.architectures:
        try:
            return save_pretrained(model, directory)
        except ConfigError:  # a switch the family's layout cannot express: keep our own names
            pass
    from safetensors.torch import save_file
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    seen: dict[int, str] = {}
    for k in list(tensors):  # a tied matrix is stored once; load_state_dict re-ties it
        ptr = tensors[k].data_ptr()
        if ptr in seen:
            del tensors[k]
        else:
            seen[ptr] = k
    atomic_write(directory / RAW_WEIGHTS, lambda tmp: save_file(tensors, tmp, metadata={"format": "pt"}))
    native = model.config.to_dict()
    native["extra"] = {**native["extra"], "attnlab_class": type(model).__name__}
    atomic_write(directory / NATIVE_CONFIG, lambda tmp: Path(tmp).write_text(json.dumps(native, indent=2) + "\n"))
    return directory


def native_classes() -> dict[str, type]:
    """Every model class `attnlab_config.json` may name: the subclasses of Model imported so far."""
    found: dict[str, type] = {}
    todo = [Model]
    while todo:
        for sub in todo.pop().__subclasses__():
            found.setdefault(sub.__name__, sub)
            todo.append(sub)
    return found


def load_native(directory: str | Path, extra: dict | None = None) -> Model:
    """A model saved in attnlab's own layout (attnlab_config.json + attnlab_state.safetensors)."""
    directory = Path(directory)
    path = directory / NATIVE_CONFIG
    data = read_json(path)  # bad JSON, deep nesting or huge ints: one error naming the file
    extra_data = data.get("extra", {})
    if not isinstance(extra_data, dict):
        raise ConfigError(f"{path}: extra: expected a JSON object, got {type(extra_data).__name__}")
    name = extra_data.pop("attnlab_class", "Encoder")
    cfg = ModelConfig.from_dict(data, source=str(path))
    cfg.extra.update(extra or {})
    classes = native_classes()
    if name not in classes:
        raise ValueError(f"{path}: unknown model class {name!r}")
    model = classes[name](cfg)
    load_model_weights(model, directory)
    return model


def load_model_weights(model: Model, directory: str | Path) -> None:
    """Fill `model` from a directory in either layout (ours when attnlab_state.safetensors is there)."""
    directory = Path(directory)
    if (directory / RAW_WEIGHTS).exists():
        # header checked against the file first
        missing, unexpected = model.load_state_dict(read_safetensors(directory / RAW_WEIGHTS), strict=False)
        tied = {k for k in missing if k.endswith("lm_head.weight") or k.endswith("mlm.decoder.weight")}
        if set(missing) - tied or unexpected:
            raise ValueError(f"{directory}: checkpoint does not fit the model (missing {sorted(set(missing) - tied)}, "
                             f"unexpected {unexpected})")
        model.tie_weights()
        return
    family = FAMILIES[model.config.model_type]
    sd, source = read_state_dict(directory)
    load_hf_state_dict(model, sd, family, family.architectures[model.hf_architecture][1], source)
