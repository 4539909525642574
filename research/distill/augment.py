"""Augmented copies of a sentence file, for distillation (issue #28): the student learns the teacher's answers
on more inputs than the labeled file holds.

TinyBERT (Jiao et al. 2020, section 3.2) relabels word-substituted copies of the task data with the teacher;
Beyer et al. (2022) show that the teacher must see the same augmented input as the student ("consistent
teaching"), so every copy written here is meant to be labeled again by the teacher
(`llm_teacher.py --label`), not to keep its source's label blindly. The operations are EDA's (Wei & Zou
2019), which need no extra model: word deletion, swaps of word pairs, a random contiguous span, and word
replacement drawn from the file's own word frequencies.

    python research/distill/augment.py rest.tsv aug.tsv --copies-long 15

Writes `sentence<TAB>label` lines (the label is the source's; the teacher's logits replace it) with no
line that equals a source line or another copy.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from llm_teacher import read_tsv  # the same sentence<TAB>0|1 files, the same file:line errors

from attnlab.data.augment import augmented_copies  # the library's EDA copies (`finetune`'s teacher rule uses them)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", help="sentence<TAB>label file with a header line")
    ap.add_argument("out")
    ap.add_argument("--min-words", type=int, default=4, help="lines shorter than this get no copy")
    ap.add_argument("--copies", type=int, default=1, help="copies of each line (at most; duplicates are dropped)")
    ap.add_argument("--copies-long", type=int, default=15, help="lines with at least this many words get one more")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rows = read_tsv(a.source)
    out = [(t, rows[k][1]) for k, t in augmented_copies([s for s, _ in rows], a.copies, copies_long=a.copies_long,
                                                         min_words=a.min_words, seed=a.seed)]
    tmp = Path(a.out + ".tmp")
    tmp.write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in out), encoding="utf-8")
    tmp.replace(a.out)
    print(f"{a.out}: {len(out)} copies of {len(rows)} lines")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
