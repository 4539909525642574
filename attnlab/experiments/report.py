"""What an experiment leaves behind: a markdown table with its claim, verdict and command, a PNG, and the
raw numbers as JSON — written atomically into one directory."""
from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def _cell(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.4g}" if abs(x) < 1e4 else f"{x:,.0f}"
    return str(x)


@dataclass
class Report:
    name: str
    claim: str
    columns: list[str]
    rows: list[list[Any]]
    verdict: str                       # computed from the numbers by the experiment
    holds: bool | None                 # True / False / None (mixed or not decidable at this scale)
    settings: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    figure: Path | None = None         # the PNG the experiment drew (already written)
    tables: list[tuple[str, list[str], list[list[Any]]]] = field(default_factory=list)  # (title, columns, rows) more
    seconds: float = 0.0
    started: float = field(default_factory=time.time)

    @staticmethod
    def _table(columns: list[str], rows: list[list[Any]]) -> str:
        head = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
        return head + "".join("| " + " | ".join(_cell(x) for x in row) + " |\n" for row in rows)

    def markdown(self) -> str:
        tiny = " --tiny" if self.settings.get("tiny") else ""
        word = {True: "holds", False: "does not hold", None: "mixed"}[self.holds]
        parts = [f"# {self.name}\n", f"**Claim (the notes):** {self.claim}\n",
                 f"**Command:** `attnlab experiment {self.name}{tiny}`\n", self._table(self.columns, self.rows)]
        parts += [f"{title}\n\n{self._table(columns, rows)}" for title, columns, rows in self.tables]
        parts += [
                 f"**Verdict: {word}.** {self.verdict}\n"]
        parts += [f"- {n}" for n in self.notes]
        if self.figure is not None:
            parts.append(f"\n![{self.name}]({self.figure.name})\n")
        settings = ", ".join(f"{k}={v}" for k, v in self.settings.items())
        parts.append(f"\n_Settings: {settings}. {self.seconds:.0f} s on {platform.machine()} "
                     f"({os.cpu_count()} cores), torch threads {_threads()}, load {_load()}._\n")
        return "\n".join(parts)

    def write(self, out: Path) -> Path:
        self.seconds = self.seconds or time.time() - self.started
        _write(out / f"{self.name}.md", self.markdown())
        _write(out / f"{self.name}.json", json.dumps(
            {"name": self.name, "claim": self.claim, "columns": self.columns, "rows": self.rows,
             "tables": self.tables, "verdict": self.verdict, "holds": self.holds, "settings": self.settings, "notes": self.notes,
             "seconds": round(self.seconds, 1)}, indent=1, default=str) + "\n")
        return out / f"{self.name}.md"


def _threads() -> int:
    import torch
    return torch.get_num_threads()


def _load() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "n/a"


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path: Path) -> Path:
    """tight layout, then write to a temporary name and rename (a killed run leaves no half PNG)."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    _pyplot().close(fig)
    os.replace(tmp, path)
    return path


def line_plot(path: Path, x: Sequence[float], series: dict[str, Sequence[float]], *, xlabel: str, ylabel: str,
              title: str, logx: bool = False, logy: bool = False, panels: dict[str, dict] | None = None) -> Path:
    """One PNG with one line per series (or several panels: title -> {series, ylabel, logy})."""
    plt = _pyplot()
    panels = panels or {title: {"series": series, "ylabel": ylabel, "logy": logy}}
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (name, panel) in zip(axes[0], panels.items()):
        for label, ys in panel["series"].items():
            ax.plot(list(x)[:len(ys)], list(ys), marker="o", label=label)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(panel["ylabel"])
        ax.set_title(name, fontsize=10)
        if logx:
            ax.set_xscale("log", base=2)
        if panel.get("logy"):
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save(fig, path)


def bar_plot(path: Path, labels: Sequence[str], groups: dict[str, Sequence[float]], *, ylabel: str,
             title: str) -> Path:
    """Grouped bars: one group per label, one bar per series."""
    import numpy as np
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(1, len(groups))
    for i, (name, values) in enumerate(groups.items()):
        ax.bar(np.arange(len(labels)) + i * width, list(values), width, label=name)
    ax.set_xticks(np.arange(len(labels)) + width * (len(groups) - 1) / 2)
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    return _save(fig, path)


def heatmaps(path: Path, panels: dict[str, Any], *, xlabel: str, ylabel: str) -> Path:
    """One heatmap per panel (title -> 2-D array), each with its own colour bar."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.4), squeeze=False)
    for ax, (name, grid) in zip(axes[0], panels.items()):
        image = ax.imshow(grid, cmap="viridis", aspect="auto")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        fig.colorbar(image, ax=ax, fraction=0.046)
    return _save(fig, path)
