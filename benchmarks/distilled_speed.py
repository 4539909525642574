"""Teacher vs distilled student on a GLUE task: held-out accuracy and inference speed, in one process.

    attnlab distill --task sst2 --teacher out/sst2 --student-layers 3 --output out/sst2-3layers --epochs 0.3
    .venv/bin/python benchmarks/distilled_speed.py out/sst2 out/sst2-3layers [--task sst2] [--threads 1]

Both models predict the same held-out examples (SST-2: the 872 sentences finetune holds out of train),
alternating, best of --repeats. Prints accuracy, examples/s, the accuracy retained and the speed-up.
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
from attnlab.tasks.finetune import _read_many, resolve_files, validation_split  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("teacher")
    ap.add_argument("student")
    ap.add_argument("--task", default="sst2")
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    task = get_task(args.task)
    train_path, valid_path = resolve_files(task)
    valid = _read_many(task, valid_path) if valid_path else validation_split(task, _read_many(task, train_path), 872)[1]
    tok = attnlab.load_tokenizer(args.teacher)
    models = {"teacher": attnlab.load(args.teacher), "student": attnlab.load(args.student)}
    best, scores = {}, {}
    with torch.no_grad():
        for _ in range(args.repeats):
            for name, model in models.items():
                start = time.perf_counter()
                predictions = task.predict(model, tok, valid, args.max_length, 64, False)
                best[name] = min(best.get(name, float("inf")), time.perf_counter() - start)
                scores[name] = task.score(valid, predictions)[task.main_metric]
    for name, model in models.items():
        print(f"{name}: {model.config.num_layers} layers, {model.num_parameters():,} parameters, "
              f"{task.main_metric} {scores[name]:.2f}, {len(valid) / best[name]:.0f} examples/s "
              f"(torch threads {torch.get_num_threads()})")
    print(f"retained {100 * scores['student'] / scores['teacher']:.1f}% of the teacher's {task.main_metric}, "
          f"speed-up {best['teacher'] / best['student']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
