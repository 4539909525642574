"""What both few-label harnesses share: run one `attnlab` command and measure it (wall seconds, the child's
user + system CPU seconds, the load average before and after: the machine is shared), and keep each
result row in OUT/results.jsonl for the lever table; `finetune_and_score` is one harness run end to end."""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_measured(args: list[str]) -> tuple[subprocess.CompletedProcess, dict]:
    """`python -m attnlab ARGS`, and its wall time, CPU seconds and the load around it."""
    load_before, cpu0, t0 = os.getloadavg(), _children_cpu(), time.time()
    done = subprocess.run([sys.executable, "-m", "attnlab", *args], capture_output=True, text=True)
    wall, cpu = time.time() - t0, _children_cpu() - cpu0
    return done, {"finetune_wall_s": round(wall, 1), "finetune_cpu_s": round(cpu, 1),
                  "load_before": [round(x, 2) for x in load_before],
                  "load_after": [round(x, 2) for x in os.getloadavg()]}


def attnlab_json(args: list[str]) -> dict:
    """The last stdout line of `python -m attnlab ARGS` (a JSON summary)."""
    done = subprocess.run([sys.executable, "-m", "attnlab", *args], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def record(out: Path, row: dict) -> None:
    line = json.dumps(row)
    print(line, flush=True)
    with open(out / "results.jsonl", "a") as f:
        f.write(line + "\n")


def finetune_and_score(task: str, model: str, train_file: Path, out: Path, n: int, draw_seed: int,
                       extra: list[str], eval_data: Path, metric: str, score_name: str) -> int:
    """`attnlab finetune TASK --train FILE` with the harness's extra flags, measured; then `attnlab evaluate`
    on `eval_data`; one row (score, timing, the schedule finetune chose, its split lines) into results.jsonl."""
    # a path among the flags (--valid FILE) names the run by its file name: its slashes would nest directories
    flags = "_".join(Path(x).name or x for x in (y.strip("-") for y in extra)) or "defaults"
    run_dir = out / f"run-{n}-draw{draw_seed}-{flags}"
    cmd = ["finetune", task, "--model", model, "--train", str(train_file), "--output", str(run_dir),
           "--no-progress", *extra]
    done, timing = run_measured(cmd)
    if done.returncode:
        sys.stderr.write(done.stderr)
        return done.returncode
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    score = attnlab_json(["evaluate", task, "--model", str(run_dir), "--data", str(eval_data)])[metric]
    record(out, {"n": n, "draw_seed": draw_seed, score_name: score, **timing,
                 "steps": summary["steps"], "s_per_step": round(timing["finetune_wall_s"] / max(1, summary["steps"]), 3),
                 "train_examples": summary["train_examples"], "valid_examples": summary["valid_examples"],
                 "epochs": summary["epochs"], "lr": summary["lr"], "batch_size": summary["batch_size"],
                 "pooling": summary.get("pooling"),
                 "split": [line for line in done.stderr.splitlines() if line.startswith(f"finetune {task}:")],
                 "command": "attnlab " + " ".join(cmd)})
    return 0
