"""Parameter-efficient fine-tuning on any `nn.Linear`: LoRA and bottleneck adapters.

LoRA (Hu et al. 2021, §4.1): a frozen weight W0 gets a trainable low-rank update,

    h = W0 x + (alpha / r) · B A x,     A (r, in) ~ Kaiming-uniform, B (out, r) = 0,

so training starts from the base model exactly, and `merge` folds (alpha / r) B A into W0 (no extra
cost at inference); `unmerge` takes it back out. rsLoRA (Kalajdzievski 2023) scales by alpha / sqrt(r).

Bottleneck adapters (Houlsby et al. 2019, §2.1): after a sublayer's output projection, a small
down-project -> nonlinearity -> up-project with a skip connection, h = y + U act(D y); U starts at zero
(near-identity at initialisation, as the paper asks).

Both wrappers *are* `nn.Linear` subclasses holding the original weight and bias Parameters, so the base
model's state-dict names do not change (`layers.0.attn.q.weight` stays, the adapter adds
`layers.0.attn.q.lora_A.weight`): checkpoint tables map them with no extra rows.

    add_lora(model, ["q", "v"], r=8, alpha=16)        # names: suffixes of module paths, or regexes
    mark_only_adapters_trainable(model)
    merge_lora(model); unmerge_lora(model)            # or merge_lora(model, unload=True) for plain Linears
"""
from __future__ import annotations

import contextlib
import math
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

ADAPTER_MARKERS = ("lora_A", "lora_B", "adapter_down", "adapter_up")


@dataclass
class LoraSettings:
    r: int = 8
    alpha: float = 8.0
    dropout: float = 0.0
    rslora: bool = False

    def __post_init__(self) -> None:
        if not (isinstance(self.r, int) and self.r > 0):
            raise ValueError(f"LoRA: r={self.r!r} must be a positive integer")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LoRA: dropout={self.dropout!r} must be in [0, 1)")

    @property
    def scaling(self) -> float:
        return self.alpha / (math.sqrt(self.r) if self.rslora else self.r)


def _adopt(new: nn.Linear, base: nn.Linear) -> None:
    """Make `new` share `base`'s weight and bias (no copy: the base Parameters move over as they are)."""
    nn.Module.__init__(new)
    new.in_features, new.out_features = base.in_features, base.out_features
    new.weight = base.weight
    new.bias = base.bias


class LoRALinear(nn.Linear):
    """y = x W0ᵀ + b + scaling · dropout(x) Aᵀ Bᵀ, or the merged W0 + scaling · B A."""

    def __init__(self, base: nn.Linear, settings: LoraSettings) -> None:
        _adopt(self, base)
        self.r, self.lora_alpha, self.scaling = settings.r, settings.alpha, settings.scaling
        w = base.weight
        self.lora_A = nn.Linear(self.in_features, settings.r, bias=False, device=w.device, dtype=w.dtype)
        self.lora_B = nn.Linear(settings.r, self.out_features, bias=False, device=w.device, dtype=w.dtype)
        self.lora_dropout = nn.Dropout(settings.dropout) if settings.dropout > 0 else nn.Identity()
        self.merged = False
        self.disabled = False  # adapters_disabled(): the frozen base model, e.g. DPO's reference policy
        self.reset_lora()

    def reset_lora(self) -> None:
        # as the paper (and peft) initialise: A random, B zero, so that B A = 0 at the start
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)

    def delta(self) -> torch.Tensor:
        return (self.lora_B.weight @ self.lora_A.weight) * self.scaling

    @torch.no_grad()
    def merge(self) -> None:
        if not self.merged:
            self.weight += self.delta().to(self.weight.dtype)
            self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        if self.merged:
            self.weight -= self.delta().to(self.weight.dtype)
            self.merged = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        if self.merged or self.disabled:
            return y
        return y + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, r={self.r}, alpha={self.lora_alpha}, merged={self.merged}"


class BottleneckLinear(nn.Linear):
    """A Houlsby adapter on the output of a projection: y = W x + b, then y + U act(D y)."""

    def __init__(self, base: nn.Linear, size: int = 64, activation: str = "gelu") -> None:
        _adopt(self, base)
        if not (isinstance(size, int) and size > 0):
            raise ValueError(f"adapter: size={size!r} must be a positive integer")
        if activation not in ("gelu", "relu", "silu"):
            raise ValueError(f"adapter: activation={activation!r}; expected gelu, relu or silu")
        w = base.weight
        self.adapter_size, self.adapter_activation, self.disabled = size, activation, False
        self.adapter_down = nn.Linear(self.out_features, size, device=w.device, dtype=w.dtype)
        self.adapter_up = nn.Linear(size, self.out_features, device=w.device, dtype=w.dtype)
        # near-identity start (Houlsby et al. §2.1): small down-projection, zero up-projection
        nn.init.normal_(self.adapter_down.weight, std=1e-2)
        nn.init.zeros_(self.adapter_down.bias)
        nn.init.zeros_(self.adapter_up.weight)
        nn.init.zeros_(self.adapter_up.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        if self.disabled:
            return y
        act = getattr(F, self.adapter_activation)
        return y + self.adapter_up(act(self.adapter_down(y)))


# ------------------------------------------------------------------------------------------ targeting
def target_matcher(patterns: list[str] | str):
    """peft's rule: a list entry matches a module whose path is the entry or ends in ".entry"; a single
    string is a regular expression that must match the whole path."""
    if isinstance(patterns, str):
        rx = re.compile(patterns)
        return lambda path: rx.fullmatch(path) is not None
    pats = list(patterns)
    return lambda path: any(path == p or path.endswith("." + p) for p in pats)


def linear_paths(model: nn.Module) -> list[str]:
    """Paths of the plain Linear layers (adapters are never wrapped twice)."""
    return [name for name, m in model.named_modules()
            if isinstance(m, nn.Linear) and not isinstance(m, (LoRALinear, BottleneckLinear))
            and not any(part in ADAPTER_MARKERS for part in name.split("."))]


def _replace(model: nn.Module, path: str, new: nn.Module) -> None:
    parent_path, _, attr = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    setattr(parent, attr, new)


def _wrap(model: nn.Module, targets, make, kind: str) -> list[str]:
    match = targets if callable(targets) else target_matcher(targets)
    chosen = [p for p in linear_paths(model) if match(p)]
    if not chosen:
        raise ValueError(f"{kind}: no linear layer matches targets={targets!r}; linear layers are e.g. "
                         f"{', '.join(linear_paths(model)[:6])}")
    for path in chosen:
        _replace(model, path, make(model.get_submodule(path)))
    return chosen


def add_lora(model: nn.Module, targets, r: int = 8, alpha: float = 8.0, dropout: float = 0.0,
             rslora: bool = False) -> list[str]:
    """Wrap every Linear whose path matches `targets` (a list of path suffixes, a regex string, or a
    predicate on the path) in a LoRALinear. Returns the wrapped paths."""
    settings = LoraSettings(r=r, alpha=alpha, dropout=dropout, rslora=rslora)
    return _wrap(model, targets, lambda m: LoRALinear(m, settings), "LoRA")


def add_bottleneck_adapters(model: nn.Module, targets=("attn.o", "ffn.down"), size: int = 64,
                            activation: str = "gelu") -> list[str]:
    """Houlsby's placement by default: after the attention output projection and after the FFN."""
    return _wrap(model, targets, lambda m: BottleneckLinear(m, size, activation), "adapter")


def adapter_modules(model: nn.Module) -> dict[str, nn.Linear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, (LoRALinear, BottleneckLinear))}


def is_adapter_parameter(name: str) -> bool:
    return any(part in ADAPTER_MARKERS for part in name.split("."))


def mark_only_adapters_trainable(model: nn.Module, also: list[str] | tuple[str, ...] = ()) -> int:
    """Freeze everything but the adapter weights (and modules whose path ends in one of `also`, e.g. a
    fresh classifier head). Returns the number of trainable parameters."""
    keep = target_matcher(list(also))
    n = 0
    for name, p in model.named_parameters():
        parts = name.split(".")[:-1]
        owners = (".".join(parts[:i]) for i in range(1, len(parts) + 1))  # the module and its parents
        p.requires_grad_(is_adapter_parameter(name) or any(keep(o) for o in owners))
        n += p.numel() if p.requires_grad else 0
    return n


def merge_lora(model: nn.Module, unload: bool = False) -> None:
    """Fold every LoRA update into its base weight. unload=True also swaps each wrapper back to a
    plain nn.Linear (the model then saves and runs exactly as a base model would)."""
    for path, m in adapter_modules(model).items():
        if isinstance(m, LoRALinear):
            m.merge()
            if unload:
                plain = nn.Linear(m.in_features, m.out_features, bias=m.bias is not None, device="meta")
                plain.weight, plain.bias = m.weight, m.bias
                _replace(model, path, plain)


@contextlib.contextmanager
def adapters_disabled(model: nn.Module):
    """Run the base model under the adapters (one copy of the weights serves as policy and frozen
    reference in DPO). Merged LoRA cannot be switched off: unmerge first."""
    mods = list(adapter_modules(model).values())
    if any(getattr(m, "merged", False) for m in mods):
        raise ValueError("adapters_disabled: a LoRA layer is merged into its weight; unmerge_lora first")
    for m in mods:
        m.disabled = True
    try:
        yield model
    finally:
        for m in mods:
            m.disabled = False


def unmerge_lora(model: nn.Module) -> None:
    for m in adapter_modules(model).values():
        if isinstance(m, LoRALinear):
            m.unmerge()


def parse_lora_spec(spec: str) -> dict:
    """The command line's `r=8,alpha=16,dropout=0.05,targets=q+v+ffn.up` (only r is required; alpha
    defaults to 2r, the common choice, dropout to 0, targets to the query and value projections)."""
    out: dict = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in ("r", "alpha", "dropout", "targets", "rslora"):
            raise ValueError(f"--lora {spec!r}: {item!r} is not KEY=VALUE with KEY one of r, alpha, dropout, "
                             "targets, rslora")
        try:
            out[key] = (int(value) if key == "r" else value.split("+") if key == "targets"
                        else value.lower() in ("1", "true", "yes") if key == "rslora" else float(value))
        except ValueError:
            raise ValueError(f"--lora {spec!r}: {key}={value!r} is not a number") from None
    if "r" not in out:
        raise ValueError(f"--lora {spec!r}: the rank r is required, e.g. --lora r=8")
    out.setdefault("alpha", 2.0 * out["r"])
    LoraSettings(r=out["r"], alpha=out["alpha"], dropout=out.get("dropout", 0.0))  # validates
    return out
