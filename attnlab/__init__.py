"""attnlab: the Transformer family from scratch on PyTorch.

    >>> import attnlab
    >>> model = attnlab.load("sentence-transformers/all-MiniLM-L6-v2")   # a local, packaged checkpoint
    >>> tok = attnlab.load_tokenizer("sentence-transformers/all-MiniLM-L6-v2")
    >>> out = model(**tok(["attention is all you need"], return_tensors="pt"))
    >>> out.last_hidden_state.shape
    torch.Size([1, 7, 384])
    >>> attnlab.save(model, "my-minilm")     # config.json + model.safetensors that transformers loads

The package's layers and where each thing lives: docs/INTERNALS.md.
"""
from __future__ import annotations

from .config import ConfigError, ModelConfig, PRESETS, preset
from .interop import from_config, load, load_tokenizer, save
from .models import Encoder, Model, ModelOutput

__version__ = "0.1.0"

__all__ = ["ConfigError", "Encoder", "Model", "ModelConfig", "ModelOutput", "PRESETS", "from_config", "load",
           "load_tokenizer", "preset", "save"]
