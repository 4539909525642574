"""attnlab: the Transformer family from scratch on PyTorch.

    >>> import attnlab
    >>> model = attnlab.load("sentence-transformers/all-MiniLM-L6-v2")   # a local, packaged checkpoint
    >>> tok = attnlab.load_tokenizer("sentence-transformers/all-MiniLM-L6-v2")
    >>> out = model(**tok(["attention is all you need"], return_tensors="pt"))
    >>> out.last_hidden_state.shape
    torch.Size([1, 7, 384])
    >>> attnlab.save(model, "my-minilm")     # config.json + model.safetensors that transformers loads

The package's layers and where each thing lives: CONTRIBUTING.md.
"""
from __future__ import annotations

from .lazy import lazy_getattr

__version__ = "0.1.0"

# Public name -> the module that defines it. Loaded on first use (PEP 562), so `import attnlab` and the
# command line's --help cost no torch import; `from attnlab import ModelConfig` works as before.
_WHERE = {
    "ConfigError": ".config", "ModelConfig": ".config", "PRESETS": ".config", "preset": ".config",
    "from_config": ".interop", "load": ".interop", "load_tokenizer": ".interop", "save": ".interop",
    "Encoder": ".models", "Model": ".models", "ModelOutput": ".models",
}

__all__ = ["ConfigError", "Encoder", "Model", "ModelConfig", "ModelOutput", "PRESETS", "from_config", "load",
           "load_tokenizer", "preset", "save"]


__getattr__ = lazy_getattr(__name__, _WHERE, globals())


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
