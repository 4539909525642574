"""Recipes for a GLUE task compared by k-fold cross-validation inside its training file.

A small task's own held-out tenth is too small to choose on: RTE's 249 pairs have a standard error of about
3 points at 55% accuracy. Here every line of `train.tsv` is scored once per recipe: the file is cut into
`--folds` parts (a seeded shuffle), and for each part `attnlab finetune TASK --train <the other parts>
--test <this part> --seed <fold + 1> [recipe flags]` runs; the command still holds its own validation out of
the file it trains on, to keep the best epoch, as it does by default. The report set (`dev.tsv`) is never
read. Recipes are paired by fold (the same lines, the same seed), so their difference has a paired standard
error. The recipe `@trainer` runs the GLUE benchmark's Trainer side (run_glue's recipe, on all of the other
parts) on the same folds and seeds. One line per run goes to `--work/results.jsonl` (resumable).

    ATTNLAB_DATA=../shared/data python research/quality/folds_grid.py --work runs/rte_folds --task rte \\
        --recipe default= --recipe glue="--lr 2e-5 --batch-size 32 --epochs 3" --recipe trainer=@trainer

Runs one thread each (OMP_NUM_THREADS=1); `--part 0/2` and `--part 1/2` share the runs between two
processes on a 2-core machine. `--table` prints the summary.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path

TRAINER = Path(__file__).resolve().parents[2] / "benchmarks" / "_glue_trainer.py"
TRAIN = {"mrpc": "MRPC", "stsb": "STS-B", "rte": "RTE", "cola": "CoLA"}
METRIC = {"mrpc": "test_f1", "stsb": "test_spearman", "rte": "test_accuracy", "cola": "test_mcc"}


def write_folds(task: str, data: Path, work: Path, folds: int) -> list[tuple[Path, Path]]:
    lines = (data / "glue" / TRAIN[task] / "train.tsv").read_text(encoding="utf-8").splitlines()
    header, rows = lines[0], [line for line in lines[1:] if line.strip()]
    order = list(range(len(rows)))
    random.Random(0).shuffle(order)
    paths = []
    for k in range(folds):
        held = set(order[k::folds])
        train_path, test_path = work / f"{task}-fold{k}-train.tsv", work / f"{task}-fold{k}-test.tsv"
        for path, kept in ((train_path, [r for i, r in enumerate(rows) if i not in held]),
                           (test_path, [rows[i] for i in sorted(held)])):
            tmp = path.with_suffix(f".tmp{os.getpid()}")  # two --part processes write the same files
            tmp.write_text("\n".join([header] + kept) + "\n", encoding="utf-8")
            os.replace(tmp, path)
        paths.append((train_path, test_path))
    return paths


def done(out: Path) -> set[tuple]:
    if not out.exists():
        return set()
    return {(r["task"], r["recipe"], r["fold"]) for r in map(json.loads, out.read_text().splitlines())}


def command(task: str, flags: str, fold: int, files: tuple[Path, Path], out_dir: Path) -> list[str]:
    """attnlab's command with the recipe's flags, or (flags "@trainer") the GLUE benchmark's Trainer side,
    run_glue's recipe on the same files (it trains on all of them: it holds nothing out)."""
    if flags == "@trainer":
        from attnlab.interop.local import resolve
        return [sys.executable, str(TRAINER), "--task", task, "--train", str(files[0]), "--report", str(files[1]),
                "--model-dir", str(resolve("minilm")), "--seed", str(fold + 1), "--threads", "1",
                "--padding", "dynamic", "--output", str(out_dir), "--result", str(out_dir) + ".json"]
    return [str(Path(sys.executable).with_name("attnlab")), "finetune", task, "--model", "minilm",
            "--train", str(files[0]), "--test", str(files[1]), "--seed", str(fold + 1), "--output", str(out_dir),
            "--no-progress", *shlex.split(flags)]


def run(task: str, recipe: str, flags: str, fold: int, files: tuple[Path, Path], work: Path) -> dict:
    out_dir = work / f"{task}-{recipe}-fold{fold}"
    cmd = command(task, flags, fold, files, out_dir)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.time()
    with open(work / f"{out_dir.name}.log", "w") as log:
        subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=log, stderr=subprocess.STDOUT,
                       check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if flags == "@trainer":
        got = json.loads(Path(str(out_dir) + ".json").read_text())
        metrics = {"test_" + k: v for k, v in got["metrics"].items()} | {"steps": got.get("steps")}
    else:
        metrics = json.loads((out_dir / "metrics.json").read_text())
    scored = sum(1 for line in files[1].read_text().splitlines()[1:] if line.strip())
    return {"task": task, "recipe": recipe, "flags": flags, "fold": fold, "seed": fold + 1,
            "metric": METRIC[task], "value": metrics[METRIC[task]], "scored": scored,
            "steps": metrics.get("steps"), "best_step": metrics.get("best_step"),
            "wall_s": round(time.time() - start, 1),
            "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
            "command": " ".join(cmd)}


def mean_se(values: list[float]) -> str:
    m = sum(values) / len(values)
    se = (sum((v - m) ** 2 for v in values) / (len(values) - 1) / len(values)) ** 0.5 if len(values) > 1 else 0.0
    return f"{m:.2f} +- {se:.2f} (n={len(values)})"


def table(out: Path, baseline: str = "default") -> None:
    """Per recipe: the mean over folds (each fold's figure weighted by its lines) with the standard error over
    folds, and each recipe's paired difference from `baseline` (else the first in the results)."""
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    by: dict[str, dict[int, dict]] = {}
    for r in rows:
        by.setdefault(r["recipe"], {})[r["fold"]] = r
    recipes = sorted(by, key=lambda name: name != baseline)
    for name in recipes:
        folds = by[name]
        pooled = sum(r["value"] * r["scored"] for r in folds.values()) / sum(r["scored"] for r in folds.values())
        cpu = sum(r["cpu_s"] for r in folds.values()) / len(folds)
        print(f"{name} ({folds[min(folds)]['flags'] or 'no flags'}): {folds[min(folds)]['metric']} folds {mean_se([r['value'] for r in folds.values()])}, "
              f"pooled {pooled:.2f}, CPU {cpu:.0f} s a run, steps {sorted({r['steps'] for r in folds.values()})}")
    for name in recipes[1:]:
        common = sorted(set(by[name]) & set(by[recipes[0]]))
        if len(common) > 1:
            diffs = [by[name][k]["value"] - by[recipes[0]][k]["value"] for k in common]
            print(f"{name} minus {recipes[0]} (paired, folds {common}): {mean_se(diffs)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--task", choices=sorted(TRAIN), default="rte")
    p.add_argument("--folds", type=int, default=5)
    p.add_argument("--recipe", action="append", default=[],
                   help="NAME=FLAGS (finetune flags; empty: the defaults); repeat for each recipe")
    p.add_argument("--part", default="0/1", help="I/N: run every N-th (recipe, fold) pair starting at I")
    p.add_argument("--table", action="store_true", help="print the summary of --work's results and stop")
    args = p.parse_args()
    out = args.work / "results.jsonl"
    if args.table:
        table(out)
        return
    data = Path(os.environ.get("ATTNLAB_DATA", ""))
    if not (data / "glue").is_dir():
        sys.exit("set ATTNLAB_DATA to the shared data folder (it has glue/)")
    recipes = [r.split("=", 1) for r in args.recipe] or [["default", ""]]
    args.work.mkdir(parents=True, exist_ok=True)
    files = write_folds(args.task, data, args.work, args.folds)
    part, parts = map(int, args.part.split("/"))
    jobs = [(fold, name, flags) for fold in range(args.folds) for name, flags in recipes]
    for fold, name, flags in jobs[part::parts]:
        if (args.task, name, fold) in done(out):
            continue
        row = run(args.task, name, flags, fold, files[fold], args.work)
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"{time.strftime('%H:%M')} {args.task} {name} fold {fold}: {row['metric']} {row['value']:.2f}; "
              f"{row['steps']} steps, CPU {row['cpu_s']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
