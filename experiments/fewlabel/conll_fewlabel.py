"""CoNLL-2003 from few labels: `attnlab finetune conll2003 --model minilm --train FILE` with no other flag
(so 10% of FILE is carved out for validation), then entity F1 on the real CoNLL valid file.

FILE holds N sentences drawn with `--draw-seed` from train.txt (0: all of train.txt).

    OMP_NUM_THREADS=1 python experiments/fewlabel/conll_fewlabel.py --n 200 --out /tmp/fewlabel-ner
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from attnlab.tasks.base import data_root
from attnlab.tasks.ner import read_conll
from timing import attnlab_json, record, run_measured


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, required=True, help="training sentences (0: all of train.txt)")
    ap.add_argument("--draw-seed", type=int, default=0)
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--out", default="/tmp/fewlabel-ner")
    ap.add_argument("extra", nargs="*", help="extra finetune flags, after --")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    train_all, valid = data_root() / "conll2003/train.txt", data_root() / "conll2003/valid.txt"
    if a.n:
        chosen = random.Random(a.draw_seed).sample(read_conll(train_all), a.n)
        train_file = out / f"conll-train-{a.n}-draw{a.draw_seed}.txt"
        # the tags are the last column, as in the real file (POS and chunk columns are not used)
        train_file.write_text("".join("".join(f"{w} {t}\n" for w, t in zip(s["words"], s["tags"])) + "\n"
                                      for s in chosen))
    else:
        train_file = train_all
    run_dir = out / f"run-{a.n}-draw{a.draw_seed}-{'_'.join(x.strip('-') for x in a.extra) or 'defaults'}"
    cmd = ["finetune", "conll2003", "--model", a.model, "--train", str(train_file), "--output", str(run_dir),
           "--no-progress", *a.extra]
    done, timing = run_measured(cmd)
    if done.returncode:
        sys.stderr.write(done.stderr)
        return done.returncode
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    scores = attnlab_json(["evaluate", "conll2003", "--model", str(run_dir), "--data", str(valid)])
    record(out, {"n": a.n, "draw_seed": a.draw_seed, "valid_entity_f1": scores["f1"], **timing,
                 "steps": summary["steps"], "s_per_step": round(timing["finetune_wall_s"] / max(1, summary["steps"]), 3),
                 "train_examples": summary["train_examples"], "valid_examples": summary["valid_examples"],
                 "epochs": summary["epochs"], "lr": summary["lr"], "batch_size": summary["batch_size"],
                 "split": [line for line in done.stderr.splitlines() if line.startswith("finetune conll2003:")],
                 "command": "attnlab " + " ".join(cmd)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
