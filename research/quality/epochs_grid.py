"""A grid of `attnlab finetune TASK --train FILE --epochs E --seed S` runs scored on validation only.

The mid-size schedule question (2,000-20,000 labelled lines): does a GLUE task's third epoch earn its
time? Every run holds its validation out of the training file (the default 10%, seed 0) and the report
set (`dev.tsv`) is never scored here. Each run's metrics.jsonl gives the validation figure at every epoch;
one line per run goes to `--out` (resumable: runs already there are skipped).

    ATTNLAB_DATA=../shared/data python research/quality/epochs_grid.py --work runs/epochs \\
        --tasks mrpc,stsb --epochs 2 3 --seeds 1 2 3

Runs one thread each (OMP_NUM_THREADS=1) so two grids can share a 2-core machine.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

TRAIN = {"mrpc": "MRPC", "stsb": "STS-B", "rte": "RTE", "cola": "CoLA", "sst2": "SST-2"}
METRIC = {"mrpc": "eval_f1", "stsb": "eval_spearman", "rte": "eval_accuracy", "cola": "eval_mcc",
          "sst2": "eval_accuracy"}


def done(out: Path) -> set[tuple[str, float, int]]:
    if not out.exists():
        return set()
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    return {(r["task"], float(r["epochs"]), int(r["seed"])) for r in rows}


def run(task: str, epochs: float, seed: int, work: Path, data: Path) -> dict:
    out_dir = work / f"{task}-e{epochs:g}-s{seed}"
    cmd = [str(Path(sys.executable).with_name("attnlab")), "finetune", task, "--model", "minilm",
           "--train", str(data / "glue" / TRAIN[task] / "train.tsv"), "--epochs", f"{epochs:g}",
           "--seed", str(seed), "--output", str(out_dir), "--no-progress"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.time()
    with open(work / f"{out_dir.name}.log", "w") as log:
        subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    curve = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    key = METRIC[task]
    evals = [(r["step"], r[key]) for r in curve if key in r]
    every = [{k: v for k, v in r.items() if k == "step" or k.startswith("eval_")} for r in curve if key in r]
    return {"task": task, "epochs": epochs, "seed": seed, "metric": key,
            "curve": evals, "evals": every, "final": evals[-1][1], "best": max(v for _, v in evals),
            "wall_s": round(time.time() - start, 1),
            "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
            "command": " ".join(cmd)}


def table(out: Path) -> None:
    """Per task and epoch count: the kept (best) and the last validation figure, mean +- standard error over
    seeds, and the paired difference between the two epoch counts where both ran on the same seeds."""
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    by: dict[tuple[str, float], dict[int, dict]] = {}
    for r in rows:
        by.setdefault((r["task"], float(r["epochs"])), {})[int(r["seed"])] = r

    def mean_se(values: list[float]) -> str:
        m = sum(values) / len(values)
        se = (sum((v - m) ** 2 for v in values) / (len(values) - 1) / len(values)) ** 0.5 if len(values) > 1 else 0.0
        return f"{m:.2f} +- {se:.2f} (n={len(values)})"

    for (task, epochs), seeds in sorted(by.items()):
        best = [r["best"] for r in seeds.values()]
        last = [r["final"] for r in seeds.values()]
        cpu = [r["cpu_s"] for r in seeds.values()]
        print(f"{task} {epochs:g} epochs: kept {mean_se(best)}, last {mean_se(last)}, CPU {sum(cpu) / len(cpu):.0f} s")
    tasks = sorted({t for t, _ in by})
    for task in tasks:
        counts = sorted(e for t, e in by if t == task)
        for a, b in zip(counts, counts[1:]):
            common = sorted(set(by[(task, a)]) & set(by[(task, b)]))
            if len(common) > 1:
                diffs = [by[(task, a)][s]["best"] - by[(task, b)][s]["best"] for s in common]
                print(f"{task} kept, {a:g} minus {b:g} epochs (paired, seeds {common}): {mean_se(diffs)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--tasks", default="mrpc,stsb,rte,cola")
    p.add_argument("--epochs", type=float, nargs="+", default=[2.0, 3.0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--table", action="store_true", help="print the summary of --work's results and stop")
    args = p.parse_args()
    if args.table:
        table(args.work / "results.jsonl")
        return
    data = Path(os.environ.get("ATTNLAB_DATA", ""))
    if not (data / "glue").is_dir():
        sys.exit("set ATTNLAB_DATA to the shared data folder (it has glue/)")
    args.work.mkdir(parents=True, exist_ok=True)
    out = args.work / "results.jsonl"
    have = done(out)
    for task in args.tasks.split(","):
        for seed in args.seeds:
            for epochs in args.epochs:
                if (task, epochs, seed) in have:
                    continue
                row = run(task, epochs, seed, args.work, data)
                with open(out, "a") as f:
                    f.write(json.dumps(row) + "\n")
                print(f"{time.strftime('%H:%M')} {task} e{epochs:g} s{seed}: final {row['final']:.2f} "
                      f"best {row['best']:.2f}; CPU {row['cpu_s']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
