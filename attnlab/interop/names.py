"""State-dict names: ours <-> Hugging Face's, through one table per family (not a converter per model).

A table row is `(ours, theirs)` or `(ours, theirs, transform)`: module or parameter paths, with `{i}`
standing for a layer number (and `{j}` for a second one, an expert's number in a mixture of experts). `ours` may be a tuple of names that HF stores fused in one tensor (GPT-2's
c_attn holds Q, K, V); such rows are concatenated / split along dim 0. `transform="T"` transposes
(GPT-2's Conv1D stores weights as (in, out)); a `HeadInterleave` regroups a fused tensor stored head by head.
"""
from __future__ import annotations

import re

import torch

from .files import CheckpointError
from .registry import Family, Row


def _pattern(template: str) -> re.Pattern:
    body = re.escape(template).replace(r"\{i\}", r"(?P<i>\d+)").replace(r"\{j\}", r"(?P<j>\d+)")
    if "(?P<i>" not in body:
        body += "(?P<i>)"  # an empty group keeps one code path for layer and non-layer rows
    return re.compile("^" + body + r"(?P<rest>(\..+)?)$")


def _fill(template: str, m: re.Match) -> str:
    """`template` with the layer (and expert) numbers of match `m`, plus the unmatched rest of the key."""
    name = template.replace("{i}", m.group("i") or "")
    if "{j}" in template:
        name = name.replace("{j}", m.group("j"))
    return name + m.group("rest")


class NameTable:
    """Bidirectional mapping between our state-dict keys and Hugging Face keys."""

    def __init__(self, rows: list[Row]) -> None:
        self.rows = []
        for row in rows:
            ours, theirs = row[0], row[1]
            transform = row[2] if len(row) > 2 else None
            ours_t = ours if isinstance(ours, tuple) else (ours,)
            self.rows.append((ours_t, theirs, transform, [_pattern(o) for o in ours_t], _pattern(theirs)))

    def to_hf(self, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        fused: dict[str, list] = {}
        for key, value in sd.items():
            for ours_t, theirs, transform, ours_pats, _ in self.rows:
                for j, pat in enumerate(ours_pats):
                    m = pat.match(key)
                    if m:
                        name = _fill(theirs, m)
                        if len(ours_t) > 1:
                            fused.setdefault(name, [None] * len(ours_t))[j] = (value, transform)
                        else:
                            out[name] = _apply(value, transform, to_hf=True)
                        break
                else:
                    continue
                break
            else:
                raise CheckpointError(f"no Hugging Face name for parameter {key!r} (interop table incomplete)")
        for name, parts in fused.items():
            transform = parts[0][1]
            out[name] = _apply(torch.cat([p[0] for p in parts], dim=0), transform, to_hf=True)
        return out

    def from_hf(self, sd: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str]]:
        """Returns (our state dict, HF keys no row matched)."""
        out: dict[str, torch.Tensor] = {}
        unmatched = []
        for key, value in sd.items():
            for ours_t, _, transform, _, theirs_pat in self.rows:
                m = theirs_pat.match(key)
                if m:
                    names = [_fill(o, m) for o in ours_t]
                    try:
                        value = _apply(value, transform)
                    except CheckpointError as err:  # a layout object that cannot read the tensor: name it
                        raise CheckpointError(f"tensor {key}: {err}") from None
                    if len(names) == 1:
                        out[names[0]] = value
                    else:
                        for name, part in zip(names, value.chunk(len(names), dim=0)):
                            out[name] = part
                    break
            else:
                unmatched.append(key)
        return out, unmatched


def _apply(value: torch.Tensor, transform, to_hf: bool = False) -> torch.Tensor:
    if transform == "T" and value.dim() == 2:
        return value.t()
    if callable(transform):  # a layout object: HeadInterleave below, XLNet's per-head tensors (interop/xlnet.py)
        return transform(value, to_hf)
    return value


class HeadInterleave:
    """A fused Q/K/V tensor stored head by head, [q0 k0 v0 | q1 k1 v1 | ...] (GPT-NeoX's query_key_value),
    against ours, [Q | K | V] along dim 0: the rows regrouped, in either direction."""

    def __init__(self, num_heads: int, parts: int = 3) -> None:
        self.num_heads, self.parts = num_heads, parts

    def __call__(self, value: torch.Tensor, to_hf: bool) -> torch.Tensor:
        rest = value.shape[1:]
        a, b = (self.parts, self.num_heads) if to_hf else (self.num_heads, self.parts)
        return value.reshape(a, b, -1, *rest).transpose(0, 1).reshape(value.shape)


def tables_for(model, family: Family, head_rows: list[Row]) -> tuple[NameTable, str]:
    """Our keys are `backbone.*` + head keys in wrappers, bare backbone keys in a backbone."""
    is_wrapper = hasattr(model, "backbone")
    # a family whose layout depends on the config (GPT-NeoX's per-head fused QKV) gives a function of it
    backbone_rows = family.backbone_rows(model.config) if callable(family.backbone_rows) else family.backbone_rows
    if not is_wrapper:
        return NameTable(backbone_rows), ""
    rows = [(tuple("backbone." + o for o in r[0]) if isinstance(r[0], tuple) else "backbone." + r[0],
             family.backbone_prefix + r[1], *r[2:]) for r in backbone_rows]
    return NameTable(rows + head_rows), family.backbone_prefix


def hf_name(table: NameTable, key: str) -> str:
    """The checkpoint's name for our parameter `key` (for error messages)."""
    for ours_t, theirs, _, ours_pats, _ in table.rows:
        for pat in ours_pats:
            m = pat.match(key)
            if m:
                return _fill(theirs, m)
    return key


def tied_keys(model) -> set[str]:
    """Keys that share storage with an earlier key (a tied output projection)."""
    seen: dict[int, str] = {}
    tied = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            tied.add(name)
        else:
            seen[id(p)] = name
    return tied
