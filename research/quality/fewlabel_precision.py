"""Few labels in fp32 or bf16: `attnlab finetune TASK --train DRAW --precision P` scored on validation only.

The question: below 500 labels the defaults run the SetFit stage (600 pair steps), which is nearly all of
a run's time; on a CPU with native bf16 it runs ~20% faster under bf16 autocast. Does it lose accuracy?
Each run trains on a draw of `benchmarks/fewlabel_vs_setfit.py` (the same files, the same seed 42) and is
scored on validation carved from the task's training data, never on the benchmark's report sets:
  sst2  attnlab's own 872 held-out sentences of train.tsv (no draw holds any of them)
  book  1,000 passages of the books' training blocks that no draw 0-2 of any size holds (seeded)
  cola  1,000 train.tsv lines that no draw 0-2 of any size holds and dev.tsv does not hold (seeded)
One line per run goes to WORK/results.jsonl (resumable); the table pairs the two precisions by draw.

    ATTNLAB_DATA=../shared/data python research/quality/fewlabel_precision.py --work runs/fl-precision \\
        --sizes book:250,sst2:250,sst2:64 --draws 0 1 2 --precisions fp32 bf16 --jobs 2

Runs one thread each (OMP_NUM_THREADS=1); `--jobs 2` runs two at a time on a 2-core machine. Wall times
printed here are not the benchmark's (threads and neighbours differ): accuracy is what this script is for.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _common import data_root  # noqa: E402
from _fewlabel_data import ATTNLAB_TASK, draw, split_for, write_task_file  # noqa: E402

VALID_SIZE, VALID_SEED = 1000, 1234
SIZES_DRAWN = (64, 250, 1000)   # every size the benchmark draws: validation holds none of their passages


def validation(task: str, split: dict) -> list[dict]:
    if task == "sst2":
        return split["project"]
    drawn = {id(e) for n in SIZES_DRAWN if n <= len(split["pool"]) for d in (0, 1, 2)
             for e in draw(split["pool"], n, d)}
    rest = [e for e in split["pool"] if id(e) not in drawn]
    return random.Random(VALID_SEED).sample(rest, min(VALID_SIZE, len(rest)))


def run(job: dict) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = Path(job["dir"])
    ft = [sys.executable, "-m", "attnlab", "finetune", job["attnlab_task"], "--model", "minilm", "--train",
          job["train"], "--output", str(out / "model"), "--seed", "42", "--no-progress", "--precision", job["precision"]]
    with open(out / "finetune.log", "w") as log:
        done = subprocess.run(ft, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    if done.returncode:
        raise RuntimeError(f"{' '.join(ft)} failed; see {out / 'finetune.log'}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    ev = [sys.executable, "-m", "attnlab", "evaluate", job["attnlab_task"], "--model", str(out / "model"),
          "--data", job["valid"]]
    done = subprocess.run(ev, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {k: job[k] for k in ("task", "size", "draw", "precision")} | {
        "valid": {k: result[k] for k in ("accuracy", "mcc") if k in result},
        "train_wall_s": summary.get("wall_time_s"), "precision_ran": summary.get("precision")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--sizes", default="book:250,sst2:250,sst2:64")
    ap.add_argument("--draws", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    results = a.work / "results.jsonl"
    done = [json.loads(line) for line in results.open()] if results.exists() else []
    seen = {(r["task"], r["size"], r["draw"], r["precision"]) for r in done}
    jobs, splits = [], {}
    for part in a.sizes.split(","):
        task, size = part.split(":")
        size = int(size)
        if task not in splits:
            splits[task] = split_for(task, data_root())
            valid = validation(task, splits[task])
            vfile = a.work / f"{task}-valid{'.csv' if task == 'book' else '.tsv'}"
            write_task_file(vfile, task, valid)
            print(f"{task}: {len(valid)} validation examples in {vfile}", flush=True)
        for d in a.draws:
            train = a.work / f"{task}-{size}-draw{d}{'.csv' if task == 'book' else '.tsv'}"
            write_task_file(train, task, draw(splits[task]["pool"], size, d))
            for p in a.precisions:
                if (task, size, d, p) in seen:
                    continue
                run_dir = a.work / f"{task}-{size}-d{d}-{p}"
                run_dir.mkdir(exist_ok=True)
                jobs.append({"task": task, "size": size, "draw": d, "precision": p, "attnlab_task": ATTNLAB_TASK[task],
                             "train": str(train), "valid": str(vfile), "dir": str(run_dir)})
    with ThreadPoolExecutor(a.jobs) as pool:
        for row in pool.map(run, jobs):
            print(json.dumps(row), flush=True)
            with results.open("a") as f:
                f.write(json.dumps(row) + "\n")
            done.append(row)
    table(done, a.precisions)


def table(rows: list[dict], precisions: list[str]) -> None:
    by = {(r["task"], r["size"], r["draw"], r["precision"]): r for r in rows}
    for task, size in sorted({(r["task"], r["size"]) for r in rows}):
        metric = "mcc" if task == "cola" else "accuracy"
        line = [f"{task}:{size}"]
        per = {}
        for p in precisions:
            vals = {d: by[(t, s, d, q)]["valid"][metric] for (t, s, d, q) in by if (t, s, q) == (task, size, p)}
            per[p] = vals
            if vals:
                m = statistics.mean(vals.values())
                se = statistics.stdev(vals.values()) / len(vals) ** 0.5 if len(vals) > 1 else float("nan")
                line.append(f"{p} {metric} {m:.2f} ± {se:.2f} (n={len(vals)})")
        if len(precisions) == 2:
            common = sorted(set(per[precisions[0]]) & set(per[precisions[1]]))
            diffs = [per[precisions[1]][d] - per[precisions[0]][d] for d in common]
            if len(diffs) > 1:
                line.append(f"paired {precisions[1]}-{precisions[0]} {statistics.mean(diffs):+.2f} ± "
                            f"{statistics.stdev(diffs) / len(diffs) ** 0.5:.2f}")
        print(" | ".join(line))


if __name__ == "__main__":
    main()
