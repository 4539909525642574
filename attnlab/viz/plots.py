"""Training curves from a run directory: `RUN_DIR/metrics.jsonl` -> PNGs (loss, accuracy and other eval
metrics, learning rate, tokens/s) and a short markdown summary.

metrics.jsonl holds one JSON object per line, always with `step`, and any of `loss`, `lr`, `tokens_per_s`,
`elapsed_s` and evaluation keys prefixed `eval_`. Train and eval values may share a line or come on lines
of their own; when a resumed run logs a step again, the later value wins.

    >>> series = read_series(["{\\"step\\": 1, \\"loss\\": 2.0}", "{\\"step\\": 2, \\"loss\\": 1.5, \\"eval_accuracy\\": 0.6}"])
    >>> series["loss"], series["eval_accuracy"]
    ([(1, 2.0), (2, 1.5)], [(2, 0.6)])
"""
from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Iterable

Series = dict[str, list[tuple[float, float]]]

# an eval key containing one of these is best at its minimum, any other at its maximum
LOWER_IS_BETTER = ("loss", "perplexity", "ppl", "error", "wer", "cer")


def read_series(lines: Iterable[str], source: str = "metrics.jsonl") -> Series:
    """Per key, the (step, value) points in step order. A bad line is an error naming it, except a
    truncated last line (the run is still writing), which is skipped with a warning."""
    lines = list(lines)
    points: dict[str, dict[float, float]] = {}
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if i == last:
                warnings.warn(f"{source} line {i + 1}: incomplete last line skipped (run still writing?)")
                continue
            raise ValueError(f"{source} line {i + 1}: not valid JSON ({err.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("step"), (int, float)):
            raise ValueError(f"{source} line {i + 1}: every record needs a numeric \"step\"")
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                points.setdefault(key, {})[record["step"]] = float(value)
    return {key: sorted(by_step.items()) for key, by_step in points.items()}


def read_metrics(run_dir: str | Path) -> Series:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (a run directory holds metrics.jsonl)")
    series = read_series(path.read_text(encoding="utf-8").splitlines(), str(path))
    if not series:
        raise ValueError(f"{path}: no metrics in it yet")
    return series


def lower_is_better(key: str) -> bool:
    return any(word in key for word in LOWER_IS_BETTER)


def _ema(values: list[float], beta: float = 0.9) -> list[float]:
    """Exponential moving average, bias-corrected, so that a noisy loss shows its trend."""
    out, avg = [], 0.0
    for t, v in enumerate(values, 1):
        avg = beta * avg + (1 - beta) * v
        out.append(avg / (1 - beta ** t))
    return out


def figures(series: Series) -> dict[str, tuple[str, str, list[str]]]:
    """Which PNGs this run has data for: name -> (title, y label, keys)."""
    evals = sorted(k for k in series if k.startswith("eval_") and k != "eval_loss" and not k.endswith("_s"))
    train_metrics = sorted(k for k in series if "accuracy" in k and not k.startswith("eval_"))
    plan = {
        "loss": ("loss", "loss", [k for k in ("loss", "eval_loss") if k in series]),
        "accuracy": ("accuracy and evaluation metrics", "value", train_metrics + evals),
        "lr": ("learning rate", "learning rate", [k for k in ("lr",) if k in series]),
        "tokens_per_s": ("throughput", "tokens / s", [k for k in ("tokens_per_s",) if k in series]),
    }
    return {name: spec for name, spec in plan.items() if spec[2]}


def plot_series(series: Series, out_dir: str | Path, title: str = "") -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (label, ylabel, keys) in figures(series).items():
        fig, ax = plt.subplots(figsize=(7, 4))
        for key in keys:
            steps, values = zip(*series[key])
            if key in ("loss", "tokens_per_s") and len(values) > 20:  # noisy per-step values: raw + trend
                line, = ax.plot(steps, values, alpha=0.3, linewidth=0.8)
                ax.plot(steps, _ema(list(values)), color=line.get_color(), label=f"{key} (smoothed)")
            else:
                ax.plot(steps, values, marker="o" if len(values) <= 30 else None, markersize=3, label=key)
        if name == "lr":
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        ax.set_xlabel("step"), ax.set_ylabel(ylabel)
        ax.set_title(f"{title}: {label}" if title else label)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = out_dir / f"{name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def _fmt(x: float) -> str:
    if math.isnan(x) or math.isinf(x):
        return str(x)
    return f"{x:.4g}" if abs(x) < 1000 else f"{x:,.0f}"


def summarize(series: Series, pngs: list[Path], title: str = "") -> str:
    """A short markdown report: what ran, where the loss went, the best eval values, throughput."""
    steps = sorted({s for points in series.values() for s, _ in points})
    lines = [f"# {title or 'run'}", "", f"- steps: {_fmt(steps[0])} → {_fmt(steps[-1])} ({len(steps)} logged)"]
    if "elapsed_s" in series:
        secs = series["elapsed_s"][-1][1]
        lines.append(f"- elapsed: {secs / 60:.1f} min" if secs >= 120 else f"- elapsed: {secs:.0f} s")
    if "loss" in series:
        pts = series["loss"]
        finite = [(s, v) for s, v in pts if math.isfinite(v)]
        bad = next((s for s, v in pts if not math.isfinite(v)), None)
        if finite:
            s_min, v_min = min(finite, key=lambda p: p[1])
            lines.append(f"- train loss: {_fmt(finite[0][1])} → {_fmt(finite[-1][1])} "
                         f"(lowest {_fmt(v_min)} at step {_fmt(s_min)})")
        if bad is not None:
            lines.append(f"- **train loss became non-finite at step {_fmt(bad)}**")
    if "lr" in series:
        lrs = [v for _, v in series["lr"]]
        lines.append(f"- learning rate: peak {max(lrs):.3g}, last {lrs[-1]:.3g}")
    if "tokens_per_s" in series:
        tps = sorted(v for _, v in series["tokens_per_s"])
        lines.append(f"- throughput: median {_fmt(tps[len(tps) // 2])} tokens/s (range {_fmt(tps[0])}–{_fmt(tps[-1])})")
    evals = sorted(k for k in series if k.startswith("eval_"))
    if evals:
        lines += ["", "| eval metric | last | best | at step |", "| --- | --- | --- | --- |"]
        for key in evals:
            pts = [(s, v) for s, v in series[key] if math.isfinite(v)] or series[key]
            pick = min if lower_is_better(key) else max
            s_best, v_best = pick(pts, key=lambda p: p[1])
            lines.append(f"| {key.removeprefix('eval_')} | {_fmt(pts[-1][1])} | {_fmt(v_best)} | {_fmt(s_best)} |")
    if pngs:
        lines += [""] + [f"![{p.stem}]({p.name})" for p in pngs]
    return "\n".join(lines) + "\n"


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None) -> tuple[list[Path], Path]:
    """Write the PNGs and summary.md (default: RUN_DIR/plots/); returns (pngs, summary path)."""
    run_dir = Path(run_dir)
    out_dir = Path(out_dir) if out_dir is not None else run_dir / "plots"
    series = read_metrics(run_dir)
    title = run_dir.resolve().name
    pngs = plot_series(series, out_dir, title)
    summary = out_dir / "summary.md"
    summary.write_text(summarize(series, pngs, title), encoding="utf-8")
    return pngs, summary
