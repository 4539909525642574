"""What every attnlab model shares: a `.config`, an output object with Hugging Face field names,
weight initialisation, parameter counts and `save()` to the Hugging Face layout.

Models know nothing of file formats: `attnlab.interop` (a layer above, never imported from here) fills
`ARCHITECTURES` when a family registers and hands `Model` its checkpoint writer."""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..config import ModelConfig

# model_type -> {Hugging Face architecture name: attnlab class}, filled by interop.registry.register
ARCHITECTURES: dict[str, dict[str, type]] = {}


@dataclass
class ModelOutput:
    """Named results; unset fields are None. `out["logits"]` works as well as `out.logits`."""
    last_hidden_state: torch.Tensor | None = None
    pooler_output: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    loss: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    cross_attentions: tuple[torch.Tensor, ...] | None = None
    past_key_values: Any = None
    extra: dict[str, torch.Tensor] = field(default_factory=dict)  # head-specific outputs (nsp_logits, ...)

    def __getitem__(self, key: str) -> Any:
        if key in self.extra:
            return self.extra[key]
        if key in {f.name for f in fields(self)}:
            return getattr(self, key)
        raise KeyError(key)

    def __getattr__(self, key: str) -> Any:  # only called for names that are not fields
        extra = self.__dict__.get("extra", {})
        if key in extra:
            return extra[key]
        raise AttributeError(key)


_INIT_FUNCTIONS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
                   "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_")
_skipping = threading.local()
_patch_lock = threading.Lock()


_originals: dict[str, Any] = {}  # torch.nn.init's functions, while some thread is inside skip_init
_users = 0                       # threads inside skip_init


def _unless_skipping(original):
    """`original` for every thread but one inside skip_init, for which it leaves the tensor as allocated."""
    def init(tensor, *args, **kwargs):
        return tensor if getattr(_skipping, "on", False) else original(tensor, *args, **kwargs)
    init.__wrapped__ = original
    return init


@contextlib.contextmanager
def skip_init():
    """Build a model whose every weight a checkpoint is about to overwrite: inside, `torch.nn.init`'s functions
    and `Model.init_weights` leave parameters as allocated (random draws for 22M parameters took ~0.3 s of a
    0.4 s MiniLM load). Only for a model the caller then fills completely (the loaders check the checkpoint
    covers every tensor first); ties are still made. Other threads are not affected: the functions are
    replaced by ones that skip only for the thread inside (the patch is module-wide, the flag per thread)."""
    global _users
    if getattr(_skipping, "on", False):
        yield
        return
    with _patch_lock:
        if _users == 0:
            for name in _INIT_FUNCTIONS:
                if hasattr(nn.init, name):
                    _originals[name] = getattr(nn.init, name)
                    setattr(nn.init, name, _unless_skipping(_originals[name]))
        _users += 1
    _skipping.on = True
    try:
        yield
    finally:
        _skipping.on = False
        with _patch_lock:
            _users -= 1
            if _users == 0:
                for name, fn in _originals.items():
                    setattr(nn.init, name, fn)
                _originals.clear()


class Model(nn.Module):
    """Base of backbones and of head wrappers. Subclasses set `config` and build their modules."""

    #: the Hugging Face architecture name this class maps onto ("BertModel", "BertForPreTraining", ...)
    hf_architecture: str = ""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self._family_architecture()

    def _family_architecture(self) -> None:
        """The Hugging Face name depends on the family as well as the class: one `MaskedLM` class is
        BertForMaskedLM, RobertaForMaskedLM or AlbertForMaskedLM. A class-level name that the config's
        family does not list is replaced (on this instance) by the one the family registers for the class."""
        family = ARCHITECTURES.get(self.config.model_type)
        current = getattr(type(self), "hf_architecture", "")
        if family is None or not isinstance(current, str) or current in family:
            return  # unknown family, a per-family property (CausalLM), or already right
        names = [name for name, cls in family.items() if cls is type(self)]
        if names:
            self.__dict__["hf_architecture"] = names[0]

    def init_weights(self) -> None:
        """Normal(0, initializer_range) for matrices and embeddings, zeros for biases, ones for norm
        scales: the BERT/GPT-2 recipe."""
        if getattr(_skipping, "on", False):  # a checkpoint fills every weight next (skip_init)
            self.tie_weights()
            return
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=std)
                if module.padding_idx is not None:
                    with torch.no_grad():
                        module.weight[module.padding_idx].zero_()
            elif hasattr(module, "weight") and isinstance(getattr(module, "weight"), nn.Parameter) \
                    and module.weight.dim() == 1:  # LayerNorm / RMSNorm
                nn.init.ones_(module.weight)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Head wrappers that share the input embedding with an output projection re-point it here."""

    def num_parameters(self) -> int:
        """Distinct parameters (a tied matrix counts once)."""
        return sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())

    #: set by attnlab.interop to its Hugging Face writer (models never import the layer above)
    writer = None

    def save(self, path: str | Path) -> Path:
        """Write config.json + model.safetensors in the Hugging Face layout (atomically); the same as
        `attnlab.save(model, path, layout="hf")`, which also offers attnlab's own layout."""
        if Model.writer is None:
            raise RuntimeError("no checkpoint writer: import attnlab (its interop layer sets one)")
        return Model.writer(self, path)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device
