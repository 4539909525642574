"""Deterministic, resumable micro-batches from token shards, split across data-parallel ranks.

The shards are dealt into `num_slices` slices (slice s holds shards s, s + num_slices, ...); a process
reads the slices it owns in turn, one micro-batch each. Everything random is drawn from generators
seeded by (seed, slice, epoch) for the example order and (seed, slice, batch number) for masking, so
the stream is a pure function of its position: `state_dict()` is a handful of counters, and a resumed
run sees exactly the batches an uninterrupted one would.

With num_slices=2: rank 0 of 2 reads slice 0 and rank 1 reads slice 1; a single process owning both
slices alternates 0, 1, 0, 1 - so one process with grad_accum=2 takes the same optimizer steps as two
processes with grad_accum=1.
"""
from __future__ import annotations

import itertools
from typing import Callable, Iterator

import numpy as np

from .shards import Shard

ExamplesFn = Callable[[list[Shard], np.random.Generator], Iterator]  # one epoch of examples
CollateFn = Callable[[list, np.random.Generator], dict]


class BatchStream:
    def __init__(self, shards: list[Shard], examples: ExamplesFn, collate: CollateFn, batch_size: int, *,
                 seed: int = 0, num_slices: int = 1, owned: list[int] | None = None, name: str = "train") -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be positive")
        if not shards:
            raise ValueError(f"{name}: the corpus has no shards with tokens in this split")
        if len(shards) < num_slices:
            raise ValueError(f"{name}: {len(shards)} shard(s) cannot be dealt to {num_slices} data slices "
                             f"(one per process); re-run prepare with a smaller --shard-tokens")
        self.examples, self.collate, self.batch_size, self.seed, self.name = examples, collate, batch_size, seed, name
        self.owned = list(owned if owned is not None else range(num_slices))
        self.slices = {s: shards[s::num_slices] for s in self.owned}
        self.turn = 0
        self.pos = {s: {"epoch": 0, "taken": 0, "batches": 0} for s in self.owned}
        self._iters: dict[int, Iterator] = {}

    def _epoch(self, s: int) -> Iterator:
        p = self.pos[s]
        rng = np.random.default_rng([self.seed, s, 0, p["epoch"]])
        return itertools.islice(self.examples(self.slices[s], rng), p["taken"], None)

    def _next_example(self, s: int):
        p = self.pos[s]
        if s not in self._iters:
            self._iters[s] = self._epoch(s)
        for _ in range(2):
            try:
                example = next(self._iters[s])
                p["taken"] += 1
                return example
            except StopIteration:
                if p["taken"] == 0:
                    n = sum(sh.num_tokens for sh in self.slices[s])
                    raise ValueError(f"{self.name}: data slice {s} ({n} tokens) is smaller than one training "
                                     "sequence; use a bigger corpus or a shorter seq_len") from None
                p["epoch"], p["taken"] = p["epoch"] + 1, 0
                self._iters[s] = self._epoch(s)
        raise AssertionError("unreachable")

    def __iter__(self) -> "BatchStream":
        return self

    def __next__(self) -> dict:
        s = self.owned[self.turn % len(self.owned)]
        self.turn += 1
        examples = [self._next_example(s) for _ in range(self.batch_size)]
        rng = np.random.default_rng([self.seed, s, 1, self.pos[s]["batches"]])
        self.pos[s]["batches"] += 1
        return self.collate(examples, rng)

    def epoch(self) -> float:
        return min(p["epoch"] for p in self.pos.values())

    def state_dict(self) -> dict:
        return {"turn": self.turn, "pos": {str(s): dict(p) for s, p in self.pos.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.turn = state["turn"]
        self.pos = {int(s): dict(p) for s, p in state["pos"].items()}
        self._iters = {}

    def load_rank_states(self, states: list[dict]) -> None:
        """Resume from the states of a run with another number of processes (the same data slices dealt
        differently): each slice continues where its owner left it. `turn` is always the number of batches
        taken from the owned slices (one per call, round robin), so it is their sum."""
        pos = {int(s): dict(p) for state in states for s, p in state["pos"].items()}
        missing = [s for s in self.owned if s not in pos]
        if missing:
            raise ValueError(f"{self.name}: the checkpoint has no position for data slice {missing[0]}; "
                             f"resume with the same data.slices ({len(pos)})")
        self.pos = {s: pos[s] for s in self.owned}
        self.turn = sum(p["batches"] for p in self.pos.values())
        self._iters = {}


def fixed_batches(shards: list[Shard], examples: ExamplesFn, collate: CollateFn, batch_size: int, *,
                  seed: int = 0, max_batches: int = 50) -> list[dict]:
    """Evaluation batches: the first `max_batches` of one pass, with fixed masks, so every evaluation
    scores the very same inputs (the last partial batch is kept)."""
    rng = np.random.default_rng([seed, 99])
    batches, buf = [], []
    for example in examples(shards, rng):
        buf.append(example)
        if len(buf) == batch_size:
            batches.append(collate(buf, np.random.default_rng([seed, 98, len(batches)])))
            buf = []
            if len(batches) >= max_batches:
                return batches
    if buf:
        batches.append(collate(buf, np.random.default_rng([seed, 98, len(batches)])))
    return batches
