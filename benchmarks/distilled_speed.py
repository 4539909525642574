"""Teacher vs distilled students on a GLUE task: held-out accuracy and inference speed, in one process.

    attnlab distill --task sst2 --teacher out/sst2 --student-layers 3 --output out/sst2-3layers --epochs 0.3
    .venv/bin/python benchmarks/distilled_speed.py out/sst2 out/sst2-3layers [out/sst2-tiny ...] \
        [--task sst2] [--threads 1] [--repeats 5]

Every model predicts the same held-out examples (SST-2: the 872 sentences finetune holds out of train),
taking turns (a, b, c, c, b, a, ...), best of --repeats. Speed is sentences per CPU-second of this process
(time.process_time: what the machine's other jobs do not steal) and per wall-second; with one thread the
two agree on a quiet machine. Prints accuracy, the accuracy retained and the speed-up of each student.
Not a test: numbers depend on the machine and on what else runs on it.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import attnlab  # noqa: E402
from attnlab.tasks import get_task  # noqa: E402
from attnlab.tasks.splits import read_many, resolve_files, validation_split  # noqa: E402

from _common import table  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("teacher")
    ap.add_argument("students", nargs="+")
    ap.add_argument("--task", default="sst2")
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    task = get_task(args.task)
    train_path, valid_path = resolve_files(task)
    valid = read_many(task, valid_path) if valid_path else validation_split(task, read_many(task, train_path), 872)[1]
    tok = attnlab.load_tokenizer(args.teacher)
    models = {"teacher": attnlab.load(args.teacher), **{s: attnlab.load(s) for s in args.students}}
    cpu = {name: float("inf") for name in models}
    wall = dict(cpu)
    scores = {}
    with torch.inference_mode():
        for i in range(args.repeats):
            for name in (list(models) if i % 2 == 0 else list(models)[::-1]):
                c0, w0 = time.process_time(), time.perf_counter()
                predictions = task.predict(models[name], tok, valid, args.max_length, args.batch_size, False)
                cpu[name] = min(cpu[name], time.process_time() - c0)
                wall[name] = min(wall[name], time.perf_counter() - w0)
                scores[name] = task.score(valid, predictions)[task.main_metric]
    rows = []
    for name, model in models.items():
        c = model.config
        rows.append([name, c.num_layers, c.hidden_size, f"{model.num_parameters():,}", f"{scores[name]:.2f}",
                     f"{100 * scores[name] / scores['teacher']:.1f}%", f"{len(valid) / cpu[name]:.0f}",
                     f"{cpu['teacher'] / cpu[name]:.2f}x", f"{len(valid) / wall[name]:.0f}",
                     f"{wall['teacher'] / wall[name]:.2f}x"])
    print(f"{len(valid)} held-out {args.task} examples, torch threads {torch.get_num_threads()}, "
          f"best of {args.repeats} interleaved")
    print(table(rows, ["model", "layers", "width", "parameters", task.main_metric, "retained",
                       "sent/CPU-s", "CPU speed-up", "sent/wall-s", "wall speed-up"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
