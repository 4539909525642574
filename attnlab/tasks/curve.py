"""The learning-curve experiment: a task's main metric against the number of labeled training examples,
for several models, each point a real `finetune` run.

    from attnlab.tasks.curve import ModelSpec, learning_curve
    learning_curve("sst2", [ModelSpec("runs/bert-mini/model"), ModelSpec("runs/bert-mini/model", scratch=True),
                            ModelSpec("minilm")], sizes=[100, 250, 1000, 4000, None], output="out/curve")

Every point is scored on the same validation examples: the task's dev file, the file given, or (SST-2)
the whole sentences `finetune` holds out with a fixed seed, whose phrases it removes from training before
any subset is drawn. A size N trains on a seeded random N of the remaining examples (`max_train_samples`;
for one seed the smaller subsets are inside the larger ones); None ("all") is the whole training part.

OUTPUT gets curve.json (every run's numbers, rewritten atomically after each run, so a killed curve resumes
where it stopped: finished runs are skipped), curve.md (rows = sizes, columns = models, mean ± standard
deviation over seeds) and curve.png; each run's own metrics stay in OUTPUT/runs/<run>/.
"""
from __future__ import annotations

import json
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

SCRATCH = " (from scratch)"


@dataclass(frozen=True)
class ModelSpec:
    """A model directory or packaged name; scratch=True: its architecture and tokenizer, random weights."""
    model: str
    scratch: bool = False

    @property
    def label(self) -> str:
        return f"{self.model}{SCRATCH if self.scratch else ''}"


def parse_sizes(text: str) -> list[int | None]:
    """"100,250,1k,4k,all" -> [100, 250, 1000, 4000, None]."""
    sizes: list[int | None] = []
    for part in (p.strip().lower() for p in text.split(",") if p.strip()):
        if part == "all":
            sizes.append(None)
            continue
        m = re.fullmatch(r"(\d+)(k?)", part)
        if not m or int(m.group(1)) == 0:
            raise ValueError(f"--sizes: {part!r} is not a positive number of examples (e.g. 250, 4k) or 'all'")
        sizes.append(int(m.group(1)) * (1000 if m.group(2) else 1))
    if not sizes:
        raise ValueError("--sizes: no sizes given")
    return sizes


def _run_key(spec: ModelSpec, size: int | None, seed: int) -> str:
    return f"{spec.label} | {'all' if size is None else size} | seed {seed}"


def _run_dir(spec: ModelSpec, size: int | None, seed: int) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", spec.model).strip("_")[-60:]
    return f"{name}{'-scratch' if spec.scratch else ''}-{'all' if size is None else size}-seed{seed}"


def _load(path: Path, settings: dict) -> list[dict]:
    """The finished runs of a curve started with the same settings (a resume), else []."""
    if not path.is_file():
        return []
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err.msg}); move it away to start the curve again") from None
    if saved.get("settings") != settings:  # mixing points trained differently would make a false curve
        diff = sorted(k for k in {*settings, *saved.get("settings", {})}
                      if settings.get(k) != saved.get("settings", {}).get(k))
        raise ValueError(f"{path}: written with other settings ({', '.join(diff)} differ); use another "
                         "--output or the same options to resume")
    return list(saved.get("runs", []))


def _save(path: Path, settings: dict, runs: list[dict]) -> None:
    from ..interop.files import atomic_write
    text = json.dumps({"settings": settings, "runs": runs}, indent=2) + "\n"
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def learning_curve(task, models: list[ModelSpec], sizes: list[int | None], output: str | Path, *,
                   seeds: tuple[int, ...] = (42,), train_file=None, valid_file=None, keep_models: bool = False,
                   log=None, **finetune_options) -> dict:
    """Fine-tune every model on every size with every seed (skipping runs curve.json already holds), then
    write curve.md and curve.png. Returns the curve.json content. `finetune_options` go to `finetune`
    unchanged (epochs, lr, batch_size, max_length, ...), the same for every run; finetune's LM-teacher rule is off
    unless they name a teacher (it would apply to a sentence-transformers checkpoint only, so the models would no
    longer share a recipe). keep_models=False deletes
    each run's weights once it is scored (a curve is dozens of models)."""
    from . import finetune, get_task
    from .finetune_options import FinetuneOptions
    task = get_task(task) if isinstance(task, str) else task
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    if not models:
        raise ValueError("learning_curve: give at least one model")
    FinetuneOptions().replace(**finetune_options)  # a misspelled or bad option: refused before the first run
    if finetune_options.get("max_eval_samples") and len(seeds) > 1:  # finetune draws that subset with `seed`
        raise ValueError("learning_curve: max_eval_samples with several seeds would score each seed on other "
                         "validation examples; give a smaller validation file instead")
    settings = {"task": task.name, "metric": task.main_metric,
                "train": str(train_file) if train_file else None, "valid": str(valid_file) if valid_file else None,
                **{k: v for k, v in sorted(finetune_options.items()) if k != "progress"}}
    path = output / "curve.json"
    runs = _load(path, settings)
    done = {r["key"] for r in runs}
    plan = [(spec, size, seed) for size in sizes for spec in models for seed in seeds]
    for i, (spec, size, seed) in enumerate(plan, 1):
        key = _run_key(spec, size, seed)
        where = f"curve: [{i}/{len(plan)}] {key}"
        if key in done:
            log(f"{where}: done before, skipped")
            continue
        run_dir = output / "runs" / _run_dir(spec, size, seed)
        summary = finetune(task, spec.model, run_dir, train_file=train_file, valid_file=valid_file, seed=seed,
                           max_train_samples=size, from_scratch=spec.scratch,
                           **{"progress": False, "teacher": "none", **finetune_options})
        value = summary.get(f"eval_{task.main_metric}")
        if value is None:
            raise ValueError(f"{run_dir / 'metrics.json'}: no eval_{task.main_metric} (was the run evaluated?)")
        if runs and (summary["valid"], summary["valid_examples"]) != (runs[0]["valid"], runs[0]["valid_examples"]):
            raise ValueError(f"{run_dir / 'metrics.json'}: scored on {summary['valid']!r}, not on the curve's "
                             f"validation data {runs[0]['valid']!r}")
        if not keep_models:
            for weights in run_dir.glob("*.safetensors"):
                weights.unlink()
        runs.append({"key": key, "model": spec.model, "scratch": spec.scratch, "size": size, "seed": seed,
                     "train_examples": summary["train_examples"], "valid": summary["valid"],
                     "valid_examples": summary["valid_examples"], "value": value, "run_dir": str(run_dir),
                     "wall_time_s": summary["wall_time_s"],
                     **{k: v for k, v in summary.items() if k.startswith("eval_")}})
        _save(path, settings, runs)
        log(f"{where}: {task.main_metric} {value:.2f} on {summary['valid_examples']} validation examples "
            f"({summary['train_examples']} trained, {summary['wall_time_s']:.0f} s)")
    curve = {"settings": settings, "runs": runs}
    _save(path, settings, runs)
    wanted = {_run_key(*p) for p in plan}
    shown = [r for r in runs if r["key"] in wanted]
    (output / "curve.md").write_text(markdown_table(shown, models, sizes, task.main_metric), encoding="utf-8")
    plot_curve(shown, models, task.main_metric, output / "curve.png", title=task.name)
    return curve


def _points(runs: list[dict], spec: ModelSpec, size: int | None) -> list[dict]:
    return [r for r in runs if r["model"] == spec.model and r["scratch"] == spec.scratch and r["size"] == size]


def _mean_spread(values: list[float]) -> tuple[float, float | None]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def markdown_table(runs: list[dict], models: list[ModelSpec], sizes: list[int | None], metric: str) -> str:
    """Rows = training sizes, columns = models; each cell the mean over seeds, ± their standard deviation
    when there are several seeds."""
    seeds = sorted({r["seed"] for r in runs})
    over = f"mean ± std over seeds {', '.join(map(str, seeds))}" if len(seeds) > 1 else f"seed {seeds[0] if seeds else '-'}"
    where = f"{runs[0]['valid_examples']} examples: {runs[0]['valid']}" if runs else "no runs yet"
    lines = [f"{metric} on the validation data ({where}); {over}", "", "| labeled examples | " + " | ".join(s.label for s in models) + " |",
             "| ---: |" + " ---: |" * len(models)]
    for size in sizes:
        cells, trained = [], set()
        for spec in models:
            points = _points(runs, spec, size)
            trained.update(r["train_examples"] for r in points)
            if not points:
                cells.append("–")
                continue
            mean, spread = _mean_spread([r["value"] for r in points])
            cells.append(f"{mean:.2f}" + (f" ± {spread:.2f}" if spread is not None else ""))
        name = str(size) if size is not None else f"all ({', '.join(map(str, sorted(trained))) or '?'})"
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_curve(runs: list[dict], models: list[ModelSpec], metric: str, path: Path, title: str = "") -> Path:
    """One line per model: the metric (mean over seeds, error bars = std) against labeled examples, log x."""
    import matplotlib
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for spec in models:
        by_size: dict[int, list[float]] = {}
        for r in runs:
            if r["model"] == spec.model and r["scratch"] == spec.scratch:
                by_size.setdefault(r["train_examples"], []).append(r["value"])
        if not by_size:
            continue
        xs = sorted(by_size)
        stats = [_mean_spread(by_size[x]) for x in xs]
        ax.errorbar(xs, [m for m, _ in stats], yerr=[s or 0.0 for _, s in stats], marker="o", capsize=3,
                    linestyle="--" if spec.scratch else "-", label=spec.label)
    ax.set_xscale("log")
    ticks = sorted({r["train_examples"] for r in runs})
    ax.set_xticks(ticks, [str(t) for t in ticks])  # the sizes themselves, not powers of ten
    ax.minorticks_off()
    ax.set_xlabel("labeled training examples")
    ax.set_ylabel(f"validation {metric}")
    ax.set_title(f"{title}: learning curve" if title else "learning curve")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
