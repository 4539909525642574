"""SST-2's hand prompt against the generic one made from its label names, for the LM teacher (PROMPTS.md).

Both prompts train the same teacher the same way (finetune's teacher: SmolLM2 cut to its bottom TEACHER_LAYERS,
TEACHER_EPOCHS at TEACHER_LR, smoothing TEACHER_SMOOTH) on N whole sentences drawn from train.tsv less the 872
clean held-out sentences (sst2_fewlabel.py's split, carved out of train.tsv with seed 0), and are scored on those
872: no GLUE dev file is read.

    OMP_NUM_THREADS=1 nice -n 10 python research/fewlabel/prompt_compare.py --n 900 --draw-seed 0 --out /tmp/prompts

Prints one JSON line per prompt (and appends it to OUT/prompts.jsonl).
"""
from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import time
from pathlib import Path

from attnlab.tasks import get_task
from attnlab.tasks.base import data_root
from attnlab.tasks.defaults import TEACHER_EPOCHS, TEACHER_LAYERS, TEACHER_LR, TEACHER_SMOOTH
from attnlab.tasks.prompt_teacher import teach
from attnlab.tasks.splits import sentence_holdout
from attnlab.tasks.teacher_prompt import task_prompt

sys.path.insert(0, str(Path(__file__).parent))
from sst2_fewlabel import sentences_of  # noqa: E402

def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


HAND = ("Review: {text}\nSentiment:", {"0": "negative", "1": "positive"})   # sst2's former hand prompt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=900)
    ap.add_argument("--draw-seed", type=int, default=0)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--prompts", default="hand,generic")
    ap.add_argument("--out", default="/tmp/prompts")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    task = get_task("sst2")
    rest, held = sentence_holdout(task.read(data_root() / task.train_file), 872, 0)
    train = random.Random(a.draw_seed).sample(sentences_of(rest), a.n)
    labels = ["0", "1"]
    generic = task_prompt(task, labels)   # from sst2's label_names
    for name in a.prompts.split(","):
        template, words = HAND if name == "hand" else generic
        t0, cpu0 = time.time(), _cpu()
        _, logits, info = teach([e["texts"][0] for e in train], [labels.index(e["label"]) for e in train],
                                [words[k] for k in labels], template, copies=[e["texts"][0] for e in held],
                                output=out / f"run-{name}-{a.draw_seed}", epochs=TEACHER_EPOCHS, lr=TEACHER_LR,
                                keep_layers=TEACHER_LAYERS, smoothing=TEACHER_SMOOTH, seed=a.seed, progress=False)
        pred = logits.argmax(-1).tolist()
        acc = 100 * sum(labels[p] == e["label"] for p, e in zip(pred, held)) / len(held)
        row = {"prompt": name, "template": template, "words": [words[k] for k in labels], "n": a.n,
               "draw_seed": a.draw_seed, "seed": a.seed, "heldout_872_accuracy": round(acc, 2),
               "train_fit": info["train_fit"], "seconds": round(time.time() - t0), "cpu_s": round(_cpu() - cpu0)}
        print(json.dumps(row), flush=True)
        with open(out / "prompts.jsonl", "a") as fh:
            fh.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
