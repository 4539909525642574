"""Model soups (Wortsman et al. 2022): the uniform average of the weights of several fine-tuned runs that start
from the same pretrained checkpoint and differ only in their seed. The runs stay in one basin of the loss, so
their average is a model of its own (one model's inference cost, unlike an ensemble) that scores at least as
well as the runs on average. On SST-2 (MiniLM, the full file, the 872 clean held-out sentences) three plain runs
scoring 90.60 / 89.68 / 90.60 average to 91.40, above their softmax ensemble's 91.06, and three other seeds' runs
(89.56 / 90.60 / 89.91) to 90.60 (experiments/fewlabel/RESULTS.md, Session 20).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch


def average_state_dicts(states: Sequence[dict], names: Sequence[str] | None = None) -> dict:
    """The uniform average of `states` (accumulated in float64, returned in each tensor's own dtype). Every
    state must have the same keys and shapes; a tensor that is not floating point (a step counter, a position
    index) must be equal in all of them. `names` say which source is which in the errors."""
    if not states:
        raise ValueError("a soup needs at least one model")
    names = list(names) if names is not None else [f"model {i}" for i in range(len(states))]
    first, first_name = states[0], names[0]
    out = {}
    for state, name in zip(states[1:], names[1:]):
        if set(state) != set(first):
            missing, extra = sorted(set(first) - set(state)), sorted(set(state) - set(first))
            raise ValueError(f"{name}: its weights are not {first_name}'s (missing {missing[:5]}, "
                             f"unexpected {extra[:5]}); a soup averages runs of one architecture")
    for key, ref in first.items():
        for state, name in zip(states[1:], names[1:]):
            if state[key].shape != ref.shape:
                raise ValueError(f"{name}: {key} has shape {tuple(state[key].shape)}, {first_name}'s "
                                 f"{tuple(ref.shape)}")
        if ref.is_floating_point():
            total = torch.zeros(ref.shape, dtype=torch.float64, device=ref.device)
            for state in states:
                total += state[key].to(device=ref.device, dtype=torch.float64)
            out[key] = (total / len(states)).to(ref.dtype)
        else:
            for state, name in zip(states[1:], names[1:]):
                if not torch.equal(state[key].to(ref.device), ref):
                    raise ValueError(f"{name}: {key} ({ref.dtype}) differs from {first_name}'s and cannot be averaged")
            out[key] = ref.clone()
    return out


def soup(directories: Sequence[str | Path], output: str | Path):
    """Average the models saved in `directories` (any layout `attnlab.load` reads; same architecture, config
    and labels) into `output` (weights written atomically, the first directory's tokenizer beside them).
    Returns the averaged model."""
    from ..interop import load, load_tokenizer, save
    directories = [Path(d) for d in directories]
    if len(directories) < 2:
        raise ValueError(f"soup: {len(directories)} model(s) given; averaging needs at least two")
    models = [load(d) for d in directories]
    base, base_dir = models[0], directories[0]
    want = base.config.to_dict()
    for model, d in zip(models[1:], directories[1:]):
        if type(model) is not type(base):
            raise ValueError(f"soup: {d} is a {type(model).__name__}, {base_dir} a {type(base).__name__}")
        got = model.config.to_dict()
        differ = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
        if differ:
            raise ValueError(f"soup: {d}'s config differs from {base_dir}'s in {', '.join(differ)}; a soup averages "
                             "runs of one model on one task")
    avg = average_state_dicts([m.state_dict() for m in models], [str(d) for d in directories])
    base.load_state_dict(avg)
    base.tie_weights()
    output = Path(output)
    save(base, output)
    load_tokenizer(base_dir).save(output)
    return base
