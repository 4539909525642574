"""A grid of `attnlab finetune TASK --train FILE --epochs E --seed S` runs scored on validation only.

The mid-size schedule question (2,000-20,000 labelled lines): does a GLUE task's third epoch earn its
time? Every run holds its validation out of the training file (the default 10%, seed 0) and the report
set (`dev.tsv`) is never scored here. Each run's metrics.jsonl gives the validation figure at every epoch;
one line per run goes to `--out` (resumable: runs already there are skipped).

    ATTNLAB_DATA=../shared/data python research/quality/epochs_grid.py --work runs/epochs \\
        --tasks mrpc,stsb --epochs 2 3 --seeds 1 2 3

`--sizes 2000 8000` trains on a seeded draw of that many lines of what remains after the validation part
(`finetune --max-train-samples`, as `attnlab curve` draws), for the mid-size range; `--epochs default` runs
the command without `--epochs` (the schedule the defaults pick for that size). `--precisions fp32 bf16`
runs each setting once per precision, and the table pairs the two by seed (the precision question: is
bf16 mixed precision free of loss on a sentence-pair or regression task?).

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


def epochs_arg(text: str) -> float | str:
    return "default" if text == "default" else float(text)


def key(task: str, size: int | None, epochs: float | str, seed: int, precision: str | None = None) -> tuple:
    return task, size, epochs if epochs == "default" else float(epochs), int(seed), precision


def done(out: Path) -> set[tuple]:
    if not out.exists():
        return set()
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    return {key(r["task"], r.get("size"), r["epochs"], r["seed"], r.get("precision")) for r in rows}


def run(task: str, size: int | None, epochs: float | str, seed: int, work: Path, data: Path,
        precision: str | None = None) -> dict:
    name = f"{task}{'' if size is None else f'-n{size}'}-e{epochs if epochs == 'default' else f'{epochs:g}'}"
    name += f"-{precision}" if precision else ""
    out_dir = work / f"{name}-s{seed}"
    cmd = [str(Path(sys.executable).with_name("attnlab")), "finetune", task, "--model", "minilm",
           "--train", str(data / "glue" / TRAIN[task] / "train.tsv"), "--seed", str(seed), "--output", str(out_dir),
           "--no-progress"]
    if epochs != "default":
        cmd += ["--epochs", f"{epochs:g}"]
    if size is not None:
        cmd += ["--max-train-samples", str(size)]
    if precision:
        cmd += ["--precision", precision]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.time()
    with open(work / f"{out_dir.name}.log", "w") as log:
        subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    curve = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    metric = METRIC[task]
    scored = [r for r in curve if metric in r and "step" in r]
    # a run of no optimizer steps (a SetFit stage alone, below 500 lines) has only its summary line
    scored = scored or [{"step": 0, **{k: v for k, v in curve[-1].items() if k.startswith("eval_")}}]
    evals = [(r["step"], r[metric]) for r in scored]
    every = [{k: v for k, v in r.items() if k == "step" or k.startswith("eval_")} for r in scored]
    steps = [r["step"] for r in scored]
    return {"task": task, "size": size, "epochs": epochs, "seed": seed, "precision": precision, "metric": metric, "steps": max(steps),
            "curve": evals, "evals": every, "final": evals[-1][1], "best": max(v for _, v in evals),
            "wall_s": round(time.time() - start, 1),
            "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
            "command": " ".join(cmd)}


def table(out: Path) -> None:
    """Per task, size and epoch count: the kept (best) and the last validation figure, mean +- standard error
    over seeds, and the paired difference between neighbouring epoch counts where both ran on the same seeds."""
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    by: dict[tuple, dict[int, dict]] = {}
    for r in rows:
        task, size, epochs, seed, precision = key(r["task"], r.get("size"), r["epochs"], r["seed"], r.get("precision"))
        by.setdefault((task, size, epochs, precision), {})[seed] = r

    def mean_se(values: list[float]) -> str:
        m = sum(values) / len(values)
        se = (sum((v - m) ** 2 for v in values) / (len(values) - 1) / len(values)) ** 0.5 if len(values) > 1 else 0.0
        return f"{m:.2f} +- {se:.2f} (n={len(values)})"

    def order(k: tuple) -> tuple:
        task, size, epochs, precision = k
        return task, size or 0, -1 if epochs == "default" else epochs, precision or ""

    for (task, size, epochs, precision), seeds in sorted(by.items(), key=lambda kv: order(kv[0])):
        best = [r["best"] for r in seeds.values()]
        last = [r["final"] for r in seeds.values()]
        cpu = [r["cpu_s"] for r in seeds.values()]
        steps = {r.get("steps") or r["curve"][-1][0] for r in seeds.values()}
        shown = epochs if epochs == "default" else f"{epochs:g}"
        shown += f" {precision}" if precision else ""
        print(f"{task} {'all' if size is None else size} lines, {shown} epochs ({'/'.join(map(str, steps))} steps): "
              f"kept {mean_se(best)}, last {mean_se(last)}, CPU {sum(cpu) / len(cpu):.0f} s")
    # paired differences between neighbouring runs of one task and size (epoch counts, then precisions)
    for task, size in sorted({(k[0], k[1]) for k in by}, key=lambda k: (k[0], k[1] or 0)):
        runs = sorted((k for k in by if k[:2] == (task, size)), key=order)
        for a, b in zip(runs, runs[1:]):
            common = sorted(set(by[a]) & set(by[b]))
            if len(common) > 1:
                diffs = [by[a][s]["best"] - by[b][s]["best"] for s in common]
                name = lambda k: f"{k[2]} epochs" + (f" {k[3]}" if k[3] else "")  # noqa: E731
                print(f"{task} {'all' if size is None else size} lines, kept, {name(a)} minus {name(b)} "
                      f"(paired, seeds {common}): {mean_se(diffs)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--tasks", default="mrpc,stsb,rte,cola")
    p.add_argument("--epochs", type=epochs_arg, nargs="+", default=[2.0, 3.0],
                   help="epoch counts; 'default' runs without --epochs")
    p.add_argument("--sizes", type=int, nargs="+", default=[None],
                   help="training lines drawn from the file (default: all of it)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--precisions", nargs="+", default=[None],
                   help="--precision for each run (default: the command's own)")
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
    for task in args.tasks.split(","):
        for size in args.sizes:
            for seed in args.seeds:
                for epochs, precision in [(e, p) for e in args.epochs for p in args.precisions]:
                    if key(task, size, epochs, seed, precision) in done(out):  # read afresh: another grid may share
                        continue
                    row = run(task, size, epochs, seed, args.work, data, precision)
                    with open(out, "a") as f:
                        f.write(json.dumps(row) + "\n")
                    print(f"{time.strftime('%H:%M')} {task} n{size} e{epochs} {precision or ''} s{seed}: final {row['final']:.2f} "
                          f"best {row['best']:.2f}; {row['steps']} steps, CPU {row['cpu_s']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
