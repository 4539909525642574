"""The public entry points, re-exported as `attnlab.load`, `attnlab.save`, `attnlab.load_tokenizer` and
`attnlab.from_config`: one function per verb, whatever the format on disk.

    model = load("minilm")                   # HF directory, attnlab's own layout, or a .gguf file
    save(model, "out")                       # HF layout when the family can express the model, else ours
"""
from __future__ import annotations

from pathlib import Path

from ..config import ModelConfig, preset
from ..models.base import Model
from .hf import load_pretrained, save_pretrained
from .local import resolve
from .native import NATIVE_CONFIG, load_native, save_model
from .registry import FAMILIES


def load(name_or_path: str | Path, architecture: str | None = None, dtype=None, device=None,
         extra: dict | None = None, quantized: bool = False) -> Model:
    """Load a model directory in the Hugging Face layout (config.json + safetensors / pytorch_model.bin),
    attnlab's own layout (attnlab_config.json), or a llama.cpp `.gguf` file (dequantized to fp32).

    `architecture` chooses the head wrapper (e.g. "BertForPreTraining"); default: what config.json says.
    `extra` adds values to config.extra before the model is built (id2label for a new classifier head).
    `quantized=True` (.gguf only) keeps Q4_0/Q4_1/Q8_0 weights as their blocks (inference on the CPU).
    """
    path = resolve(name_or_path)
    if path.suffix.lower() == ".gguf":  # llama.cpp's single file: config, weights and tokenizer
        from .gguf import load_gguf
        return load_gguf(path, dtype=dtype, device=device, quantized=quantized)
    if quantized:
        raise ValueError(f"{name_or_path}: quantized=True applies to .gguf files only")
    if not (path / "config.json").exists() and (path / NATIVE_CONFIG).exists():  # no HF family fits it
        model = load_native(path, extra)
        return (model.to(dtype) if dtype is not None else model).to(device or "cpu").eval()
    return load_pretrained(path, architecture=architecture, dtype=dtype, device=device, extra=extra)


def keeps_quantized(name_or_path: str | Path, dequantize: bool = False, note=None) -> bool:
    """Whether `load(..., quantized=True)` should be used: a .gguf runs on its quantized blocks unless
    `dequantize` asks for fp32 or the block kernels cannot be built here (then fp32, and `note` gets one
    line saying why)."""
    if dequantize or resolve(name_or_path).suffix.lower() != ".gguf":
        return False
    from ..nn import quantized
    if not quantized.available():
        if note is not None:
            note(f"note: quantized GGUF kernels unavailable ({quantized.why_unavailable()}); using fp32")
        return False
    return True


def save(model: Model, directory: str | Path, layout: str = "auto") -> Path:
    """Write `model` into `directory` atomically. layout="auto": the Hugging Face layout (transformers
    loads it) when the model's family can express it, else attnlab's own (`load` reads both);
    layout="hf": the Hugging Face layout or a ConfigError naming the switch it cannot express."""
    if layout == "hf":
        return save_pretrained(model, directory)
    if layout != "auto":
        raise ValueError(f"save: layout={layout!r}; expected 'auto' or 'hf'")
    return save_model(model, directory)


def load_tokenizer(name_or_path: str | Path):
    from ..tokenizers import build_byte_tokenizer, load_tokenizer as _load
    if str(name_or_path) in ("byte", "byt5") and not Path(name_or_path).exists():  # nothing to read: bytes
        return build_byte_tokenizer()
    path = resolve(name_or_path)
    if path.suffix.lower() == ".gguf":
        from .gguf import tokenizer_from_gguf
        return tokenizer_from_gguf(path)
    return _load(path)


def from_config(config: ModelConfig | str, architecture: str | None = None) -> Model:
    """A randomly initialised model from a config or preset name."""
    cfg = preset(config) if isinstance(config, str) else config
    family = FAMILIES[cfg.model_type]
    cls, _ = family.architectures[architecture or family.default_architecture]
    return cls(cfg)


# `Model.save(dir)` predates `save`; the models layer cannot import this one, so it is handed the writer.
Model.writer = staticmethod(lambda model, directory: save(model, directory, layout="hf"))
