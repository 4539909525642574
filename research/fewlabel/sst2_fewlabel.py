"""SST-2 from few labels, the way a new user meets it: `attnlab finetune sst2 --model minilm --train FILE`
with no other flag, scored on a clean held-out part of SST-2.

The clean part is the 872 whole sentences attnlab's own SST-2 hold-out sets aside (`sentence_holdout`,
seed 0); every phrase of them is removed from what training files may draw from. A training file of N
labeled examples holds N whole sentences (lines that are no phrase of another line) drawn with `--draw-seed`
from the rest: few-label users label sentences, not parse-tree fragments, and SetFit's SST-2 is sentences.

    OMP_NUM_THREADS=1 python research/fewlabel/sst2_fewlabel.py --n 250 --draw-seed 0 --out /tmp/fewlabel
    ... --n 0          # the whole remaining train.tsv (phrases included): the full-file row
    ... -- --lr 1e-4   # anything after -- is passed to finetune (for the lever table; the goal is none)

Prints one JSON line (and appends it to OUT/results.jsonl): accuracy on the 872 clean sentences, wall time
and CPU seconds of finetune, load average, command.
"""
from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

from attnlab.tasks import get_task
from attnlab.tasks.base import data_root
from attnlab.tasks.splits import sentence_holdout, whole_sentences
from timing import finetune_and_score


def _write(path: Path, examples: list[dict]) -> None:
    path.write_text("sentence\tlabel\n" + "".join(f"{e['texts'][0]}\t{e['label']}\n" for e in examples))


sentences_of = whole_sentences  # (kept under its old name for the other research scripts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, required=True, help="labeled training sentences (0: the whole rest of train.tsv)")
    ap.add_argument("--draw-seed", type=int, default=0, help="which N sentences")
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--out", default="/tmp/fewlabel")
    ap.add_argument("extra", nargs="*", help="extra finetune flags, after --")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    task = get_task("sst2")
    held_file, rest_file = out / "sst2-clean-heldout-872.tsv", out / "sst2-rest.tsv"
    if not held_file.exists() or not rest_file.exists():
        rest, held = sentence_holdout(task.read(data_root() / task.train_file), 872, 0)
        _write(held_file, held)
        _write(rest_file, rest)
    if a.n:
        pool = sentences_of(task.read(rest_file))
        train = random.Random(a.draw_seed).sample(pool, a.n)
        train_file = out / f"sst2-train-{a.n}-draw{a.draw_seed}.tsv"
        _write(train_file, train)
    else:
        train_file = rest_file
    return finetune_and_score("sst2", a.model, train_file, out, a.n, a.draw_seed, a.extra, held_file, "accuracy",
                              "clean_heldout_accuracy")


if __name__ == "__main__":
    sys.exit(main())
