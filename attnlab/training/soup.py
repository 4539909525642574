"""Model soups (Wortsman et al. 2022): the uniform average of the weights of several fine-tuned runs that start
from the same pretrained checkpoint and differ only in their seed. The runs stay in one basin of the loss, so
their average is a model of its own (one model's inference cost, unlike an ensemble) that scores at least as
well as the runs on average. On SST-2 (MiniLM, the full file, the 872 clean held-out sentences) three plain runs
scoring 90.60 / 89.68 / 90.60 average to 91.40, above their softmax ensemble's 91.06, and three other seeds' runs
(89.56 / 90.60 / 89.91) to 90.60 (research/fewlabel/RESULTS.md).
"""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import Iterable, Sequence

import torch


def average_state_dicts(states: Iterable[dict], names: Iterable[str] | None = None) -> dict:
    """The uniform average of `states` (accumulated in float64, returned in each tensor's own dtype). Every
    state must have the same keys and shapes; a tensor that is not floating point (a step counter, a position
    index) must be equal in all of them. `names` say which source is which in the errors. `states` may be a
    generator: one state is held at a time, beside the float64 sums."""
    names = iter(names) if names is not None else (f"model {i}" for i in itertools.count())
    sums, dtypes, first_name, count = {}, {}, "", 0
    for state, name in zip(states, names):
        count += 1
        if count == 1:
            first_name = name
            sums = {k: v.to(torch.float64, copy=True) if v.is_floating_point() else v.clone() for k, v in state.items()}
            dtypes = {k: v.dtype for k, v in state.items()}
            continue
        if set(state) != set(sums):
            missing, extra = sorted(set(sums) - set(state)), sorted(set(state) - set(sums))
            raise ValueError(f"{name}: its weights are not {first_name}'s (missing {missing[:5]}, "
                             f"unexpected {extra[:5]}); a soup averages runs of one architecture")
        for key, total in sums.items():
            value = state[key]
            if value.shape != total.shape:
                raise ValueError(f"{name}: {key} has shape {tuple(value.shape)}, {first_name}'s "
                                 f"{tuple(total.shape)}")
            if dtypes[key].is_floating_point:
                total += value.to(device=total.device, dtype=torch.float64)
            elif not torch.equal(value.to(total.device), total):
                raise ValueError(f"{name}: {key} ({dtypes[key]}) differs from {first_name}'s and cannot be averaged")
    if not count:
        raise ValueError("a soup needs at least one model")
    return {k: (v / count).to(dtypes[k]) if dtypes[k].is_floating_point else v for k, v in sums.items()}


def soup(directories: Sequence[str | Path], output: str | Path):
    """Average the models saved in `directories` (any layout `attnlab.load` reads; same architecture, config
    and labels) into `output` (weights written atomically, the first directory's tokenizer beside them).
    The runs are loaded one at a time, so memory stays about four models' worth (the first, the float64
    sums, the one being read) whatever their number. Returns the averaged model."""
    from ..interop import load, load_tokenizer, save
    directories = [Path(d) for d in directories]
    if len(directories) < 2:
        raise ValueError(f"soup: {len(directories)} model(s) given; averaging needs at least two")
    base, base_dir = load(directories[0]), directories[0]
    want = base.config.to_dict()

    def states():
        yield base.state_dict()
        for d in directories[1:]:
            model = load(d)
            if type(model) is not type(base):
                raise ValueError(f"soup: {d} is a {type(model).__name__}, {base_dir} a {type(base).__name__}")
            got = model.config.to_dict()
            differ = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
            if differ:
                raise ValueError(f"soup: {d}'s config differs from {base_dir}'s in {', '.join(differ)}; a soup "
                                 "averages runs of one model on one task")
            yield model.state_dict()

    avg = average_state_dicts(states(), [str(d) for d in directories])
    base.load_state_dict(avg)
    base.tie_weights()
    output = Path(output)
    save(base, output)
    load_tokenizer(base_dir).save(output)
    return base
