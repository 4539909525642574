"""CoNLL-2003 from few labels: `attnlab finetune conll2003 --model minilm --train FILE` with no other flag
(so 10% of FILE is carved out for validation), then entity F1 on the real CoNLL valid file.

FILE holds N sentences drawn with `--draw-seed` from train.txt (0: all of train.txt).

    OMP_NUM_THREADS=1 python research/fewlabel/conll_fewlabel.py --n 200 --out /tmp/fewlabel-ner
"""
from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

from attnlab.tasks.base import data_root
from attnlab.tasks.ner import read_conll
from timing import finetune_and_score


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
    return finetune_and_score("conll2003", a.model, train_file, out, a.n, a.draw_seed, a.extra, valid, "f1",
                              "valid_entity_f1")


if __name__ == "__main__":
    sys.exit(main())
