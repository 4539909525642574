"""attnlab: the Transformer family from scratch on PyTorch.

    >>> import attnlab
    >>> model = attnlab.load("sentence-transformers/all-MiniLM-L6-v2")   # a local, packaged checkpoint
    >>> tok = attnlab.load_tokenizer("sentence-transformers/all-MiniLM-L6-v2")
    >>> out = model(**tok(["attention is all you need"], return_tensors="pt"))
    >>> out.last_hidden_state.shape
    torch.Size([1, 7, 384])
"""
from __future__ import annotations

from pathlib import Path

from .config import ConfigError, ModelConfig, PRESETS, preset
from .models import Encoder, Model, ModelOutput

__version__ = "0.1.0"


def load(name_or_path: str | Path, architecture: str | None = None, dtype=None, device=None,
         extra: dict | None = None) -> Model:
    """Load a model directory in the Hugging Face layout (config.json + safetensors / pytorch_model.bin),
    or a llama.cpp `.gguf` file (dequantized to fp32).

    `architecture` chooses the head wrapper (e.g. "BertForPreTraining"); default: what config.json says.
    `extra` adds values to config.extra before the model is built (id2label for a new classifier head).
    """
    from .interop.hf import load_pretrained
    from .interop.local import resolve
    path = resolve(name_or_path)
    if path.suffix.lower() == ".gguf":  # llama.cpp's single file: config, weights and tokenizer
        from .interop.gguf import load_gguf
        return load_gguf(path, dtype=dtype, device=device)
    return load_pretrained(path, architecture=architecture, dtype=dtype, device=device, extra=extra)


def load_tokenizer(name_or_path: str | Path):
    from .interop.local import resolve
    from .tokenizers import load_tokenizer as _load
    path = resolve(name_or_path)
    if path.suffix.lower() == ".gguf":
        from .interop.gguf import tokenizer_from_gguf
        return tokenizer_from_gguf(path)
    return _load(path)


def from_config(config: ModelConfig | str, architecture: str | None = None) -> Model:
    """A randomly initialised model from a config or preset name."""
    from .interop.hf import FAMILIES
    cfg = preset(config) if isinstance(config, str) else config
    family = FAMILIES[cfg.model_type]
    cls, _ = family.architectures[architecture or family.default_architecture]
    return cls(cfg)


__all__ = ["ConfigError", "Encoder", "Model", "ModelConfig", "ModelOutput", "PRESETS", "from_config", "load",
           "load_tokenizer", "preset"]
