"""Self-training on unlabeled in-domain sentences at 1,000 SST-2 labels (issue #21, Session 15): the default
fine-tune of a draw (the teacher) labels SST-2's other training sentences, those neither drawn nor held out
(~5,000, their labels unread); the ones it gives >= 0.9 probability join the 900 gold training sentences, and a
fresh all-MiniLM-L6-v2 trains on both with the default schedule, chosen on the same 100 held-out sentences as
the teacher, and scored on the 872 clean held-out sentences.

The teacher is the harness's default run when it exists (`--teacher DIR`, e.g. a `--self-train` run's
OUTPUT/teacher), else it is trained here into OUT. Needs the files `sst2_fewlabel.py --out DIR` writes in DIR.

    OMP_NUM_THREADS=1 python research/fewlabel/selftrain_unlabeled.py --runs DIR --draw 0 --seed 42 --out OUT

Prints one JSON line (and appends it to OUT/results.jsonl).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from attnlab.tasks import get_task
from attnlab.tasks.finetune import _load_for_eval, evaluate, finetune
from attnlab.tasks.base import labels_of
from attnlab.tasks.selftrain import CONFIDENCE, confident_labels
from attnlab.tasks.defaults import DEFAULT_HOLDOUT, holdout_size
from attnlab.tasks.splits import validation_split
from sst2_fewlabel import _write, sentences_of


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=Path, required=True, help="the harness's --out (training draws, rest, held-out)")
    ap.add_argument("--draw", type=int, required=True)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--teacher", type=Path, help="a trained default run of this draw and seed")
    ap.add_argument("--confidence", type=float, default=CONFIDENCE)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    task, draw_file = get_task("sst2"), a.runs / f"sst2-train-{a.n}-draw{a.draw}.tsv"
    held_file = a.runs / "sst2-clean-heldout-872.tsv"
    a.out.mkdir(parents=True, exist_ok=True)
    tag = f"d{a.draw}-s{a.seed}-c{a.confidence:g}"
    drawn = task.read(draw_file)
    train, valid, _ = validation_split(task, drawn, holdout_size(len(drawn), DEFAULT_HOLDOUT))  # the teacher's split
    teacher = a.teacher or a.out / f"teacher-{tag}"
    if not (teacher / "metrics.json").exists():
        finetune(task, "minilm", teacher, train_file=str(draw_file), seed=a.seed, progress=False)
    known = {" ".join(e["texts"][0].split()) for e in drawn}
    pool = [e["texts"][0] for e in sentences_of(task.read(a.runs / "sst2-rest.tsv"))
            if " ".join(e["texts"][0].split()) not in known]
    net, tokenizer = _load_for_eval(task, teacher)
    labels, label2id = labels_of(net)
    feats = task.features([{"texts": [s]} for s in pool], tokenizer, 64, label2id, training=False)
    kept = [{"texts": [pool[i]], "label": label}
            for i, label, _ in confident_labels(net, feats, tokenizer.pad_token_id, labels, a.confidence)]
    train_file, valid_file = a.out / f"{tag}-train.tsv", a.out / f"{tag}-valid.tsv"
    _write(train_file, train + kept)
    _write(valid_file, valid)
    t0 = time.process_time()
    student = finetune(task, "minilm", a.out / tag, train_file=str(train_file), valid_file=str(valid_file),
                       seed=a.seed, progress=False)
    row = {"draw": a.draw, "seed": a.seed, "confidence": a.confidence, "unlabeled": len(pool), "kept": len(kept),
           "teacher_accuracy": evaluate(task, teacher, str(held_file))["accuracy"],
           "student_accuracy": evaluate(task, a.out / tag, str(held_file))["accuracy"],
           "student_steps": student["steps"], "student_best_step": student["best_step"],
           "student_cpu_s": round(time.process_time() - t0)}
    print(json.dumps(row), flush=True)
    with open(a.out / "results.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
