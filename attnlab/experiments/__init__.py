"""The notes' claims as experiments anyone can rerun: `attnlab experiment NAME` (or `run(NAME, out)`).

Each experiment is one module with NAME, CLAIM and `run(out, *, tiny, data) -> Report`; the Report
writes a markdown table with the verdict and a PNG next to it. `tiny=True` is the seconds-long version
the tests run; the default is the full run (at most ~15 minutes on 2 cores), whose results
docs/research/claims.md gathers. A verdict is computed from the numbers, never written in advance: where a
claim does not hold at this scale, the report says so.
"""
from __future__ import annotations

import importlib
import time
from pathlib import Path
from types import ModuleType

from .report import Report

# name on the command line -> module; the order is `attnlab experiment --list`'s (the notes' order).
EXPERIMENTS = {
    "bottleneck": "bottleneck",        # 1. attention vs the fixed-vector bottleneck (RNN, RNN+attention, Transformer)
    "parallel": "parallel",            # 2. parallel vs sequential: Transformer layer vs LSTM layer
    "senses": "senses",                # 3. contextual vs static embeddings ("bank", "bat", ...)
    "sqrt-dk": "sqrt_dk",              # 4. why attention scores are divided by sqrt(d_k)
    "warmup": "warmup",                # 5. post-LN needs warmup, pre-LN does not
    "positions": "positions",          # 6. learned / sinusoidal / RoPE / relative bias; 2x context
    "activations": "activations",      # 7. ReLU / GELU / SwiGLU / GeGLU at equal parameters
    "gqa": "gqa",                      # 8. MHA / GQA / MQA: quality vs KV cache vs decode speed
    "scaling": "scaling",              # 9. loss vs model size: a power law
    "heads": "heads",                  # 10. heads specialise; a probe per layer (bertology)
    "vocab-overlap": "vocab_overlap",  # 11. a vocabulary learned on books vs bert-base-uncased's
    "objectives": "objectives",        # 12. no NSP (RoBERTa); ELECTRA's sample efficiency
}


def experiment(name: str) -> ModuleType:
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; `attnlab experiment --list` shows "
                         f"{', '.join(EXPERIMENTS)}")
    return importlib.import_module(f"{__name__}.{EXPERIMENTS[name]}")


def listing() -> list[tuple[str, str]]:
    """(name, the claim it tests) for every experiment."""
    return [(name, experiment(name).CLAIM) for name in EXPERIMENTS]


def run(name: str, out: str | Path, *, tiny: bool = False, data: str | Path | None = None) -> Report:
    """Run one experiment and write NAME.md + NAME.png (+ NAME.json) into `out`."""
    module = experiment(name)
    started = time.time()
    report = module.run(Path(out), tiny=tiny, data=Path(data) if data else None)
    report.seconds = time.time() - started
    report.write(Path(out))
    return report


def write_index(out: str | Path, index: str | Path | None = None) -> Path:
    """`index` (default OUT/EXPERIMENTS.md): every experiment whose results OUT holds, in the notes' order:
    its claim, the verdict its run computed, its plot, and a link to its full table."""
    import json
    import os
    out = Path(out)
    index = Path(index) if index else out / "EXPERIMENTS.md"
    rel = lambda p: os.path.relpath(p, index.parent)  # noqa: E731  (links work from where the index lives)
    parts = ["# The notes' claims, measured\n",
             "Each section is one `attnlab experiment NAME` run on this machine; the verdict is computed from "
             "the run's numbers. Full tables, settings and machine load: the linked NAME.md files.\n"]
    found = 0
    for name in EXPERIMENTS:
        path = out / f"{name}.json"
        if not path.exists():
            continue
        found += 1
        r = json.loads(path.read_text())
        word = {True: "holds", False: "does not hold", None: "mixed"}[r["holds"]]
        parts.append(f"## {name}: {word}\n\n**Claim:** {r['claim']}\n\n**Verdict:** {r['verdict']}\n\n"
                     f"![{name}]({rel(out / f'{name}.png')})\n\nTable and settings: "
                     f"[{name}.md]({rel(out / f'{name}.md')}) · "
                     f"`attnlab experiment {name}` · {r['seconds']:.0f} s\n")
    if not found:
        raise FileNotFoundError(f"{out}: no experiment results (NAME.json) to index")
    index.parent.mkdir(parents=True, exist_ok=True)
    index.write_text("\n".join(parts), encoding="utf-8")
    return index


__all__ = ["EXPERIMENTS", "Report", "experiment", "listing", "run", "write_index"]
