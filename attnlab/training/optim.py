"""AdamW with BERT's weight-decay exclusions, and the learning-rate schedules.

Weight decay pulls weights towards zero; on a bias or a norm's scale/shift that only fights the
normalisation, so (as in BERT's optimization.py and nanoGPT's configure_optimizers) parameters with
fewer than 2 dimensions get no decay.

Schedule: linear warmup from 0 to `lr` over `warmup_steps`, then linear or cosine decay to
`min_lr_ratio * lr` at `max_steps` (or `constant`). For lr=1e-3, warmup 10, max 110, cosine:
step 0 -> 0, step 5 -> 5e-4, step 10 -> 1e-3, step 60 -> 5e-4, step 110 -> 0.
`inverse_sqrt` is the original Transformer's (Vaswani et al. 2017, §5.3): with s = step + 1, the factor
min(s / warmup, sqrt(warmup / s)) rises linearly to 1 at s = warmup and then falls as 1/sqrt(s), so
lr * factor equals d^-0.5 * min(s^-0.5, s * warmup^-1.5) when lr = d^-0.5 * warmup^-0.5.

Layer-wise learning-rate decay (`layer_decay` < 1; Howard & Ruder 2018 "discriminative fine-tuning", ELECTRA
§3.1, Sun et al. 2019 "How to fine-tune BERT for text classification" §5.3): the top of the network learns at
`lr`, each layer below at `layer_decay` times the one above it, the embeddings lowest, so the general features
of the lower layers move least. Depth is read from the parameter's name: `...embeddings...` is 0, `...layers.i...`
is i + 1, anything else (final norm, pooler, task head) is the top, L + 1.
"""
from __future__ import annotations

import math
import re

import torch
from torch import nn

SCHEDULES = ("linear", "cosine", "constant", "inverse_sqrt")


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def layer_depth(name: str, num_layers: int) -> int:
    """0 for the embeddings, i + 1 for `layers.i`, num_layers + 1 for everything above (see the module doc)."""
    m = _LAYER.search(name)
    if m:
        return int(m.group(1)) + 1
    return 0 if "embeddings." in name else num_layers + 1


def param_groups(model: nn.Module, weight_decay: float, layer_decay: float = 1.0) -> list[dict]:
    """AdamW groups: decayed (2-d and up) and not; with `layer_decay` < 1 also one pair per depth, each group's
    "lr_scale" (layer_decay ** (top - depth)) multiplying the learning rate. The top groups come first, so that
    param_groups[0]["lr"] is the peak rate the logs show."""
    if not 0.0 < layer_decay <= 1.0:
        raise ValueError(f"layer_decay={layer_decay}: expected a factor in (0, 1] (1 = the same rate everywhere)")
    named = {id(p): (n, p) for n, p in model.named_parameters() if p.requires_grad}.values()  # tied weights once
    if layer_decay == 1.0:
        decay, no_decay = [], []
        for _, p in named:
            (decay if p.dim() >= 2 else no_decay).append(p)
        return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    layers = {int(m.group(1)) for n, _ in model.named_parameters() for m in [_LAYER.search(n)] if m}
    if not layers:
        raise ValueError(f"layer_decay={layer_decay}: {type(model).__name__} has no parameters named layers.<i>. "
                         "to decay by depth")
    top = max(layers) + 2
    groups: dict[tuple[int, bool], dict] = {}
    for n, p in named:
        depth, decayed = layer_depth(n, top - 1), p.dim() >= 2
        g = groups.setdefault((depth, decayed), {"params": [], "weight_decay": weight_decay if decayed else 0.0,
                                                 "lr_scale": layer_decay ** (top - depth)})
        g["params"].append(p)
    return [groups[k] for k in sorted(groups, key=lambda k: (-k[0], not k[1]))]


def lr_factor(step: int, *, warmup_steps: int, max_steps: int, schedule: str = "linear",
              min_lr_ratio: float = 0.0) -> float:
    """Multiplier of the peak learning rate at `step` (0-based: the update about to be made)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule={schedule!r}: expected one of {', '.join(SCHEDULES)}")
    if schedule == "inverse_sqrt":  # 1-based like the paper's step_num: the first update is not at lr 0
        s, w = step + 1, max(warmup_steps, 1)
        return min(s / w, math.sqrt(w / s))
    if warmup_steps and step < warmup_steps:
        return step / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
    shape = 1.0 - progress if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return min_lr_ratio + (1.0 - min_lr_ratio) * shape


def fused_supported(params: list[torch.Tensor]) -> bool:
    """AdamW(fused=True) needs floating-point parameters on one device type its build has a kernel for
    (CUDA, and the CPU since PyTorch 2.4); DTensor shards (FSDP) take the foreach path."""
    devices = {p.device.type for p in params}
    if len(devices) != 1 or not all(p.is_floating_point() for p in params):
        return False
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a build without torch.distributed
        DTensor = ()
    if any(isinstance(p, DTensor) for p in params):
        return False
    return devices <= {"cpu", "cuda"}


def build_optimizer(model: nn.Module, *, lr: float, weight_decay: float, betas=(0.9, 0.999), eps: float = 1e-8,
                    warmup_steps: int, max_steps: int, schedule: str = "linear", min_lr_ratio: float = 0.0,
                    fused: bool = False, layer_decay: float = 1.0):
    """AdamW over `param_groups` and a LambdaLR of `lr_factor`. fused=True uses the fused kernel where
    `fused_supported` (the same update within float rounding, ~1e-7; one kernel instead of one per tensor)."""
    groups = param_groups(model, weight_decay, layer_decay)
    for g in groups:  # LambdaLR scales each group's own initial rate
        g["lr"] = lr * g.pop("lr_scale", 1.0)
    fused = fused and fused_supported([p for g in groups for p in g["params"]])
    optimizer = torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps, **({"fused": True} if fused else {}))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(
        step, warmup_steps=warmup_steps, max_steps=max_steps, schedule=schedule, min_lr_ratio=min_lr_ratio))
    return optimizer, scheduler
