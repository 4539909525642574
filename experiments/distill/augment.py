"""Augmented copies of a sentence file, for distillation (issue #28): the student learns the teacher's answers
on more inputs than the labeled file holds.

TinyBERT (Jiao et al. 2020, section 3.2) relabels word-substituted copies of the task data with the teacher;
Beyer et al. (2022) show that the teacher must see the same augmented input as the student ("consistent
teaching"), so every copy written here is meant to be labeled again by the teacher
(`llm_teacher.py --label`), not to keep its source's label blindly. The operations are EDA's (Wei & Zou
2019), which need no extra model: word deletion, swaps of word pairs, a random contiguous span, and word
replacement drawn from the file's own word frequencies.

    python experiments/distill/augment.py rest.tsv aug.tsv --copies-long 15

Writes `sentence<TAB>label` lines (the label is the source's; the teacher's logits replace it) with no
line that equals a source line or another copy.
"""
from __future__ import annotations

import argparse
import random
from collections import Counter
from pathlib import Path

from llm_teacher import read_tsv  # the same sentence<TAB>0|1 files, the same file:line errors


def augment(words: list[str], rng: random.Random, vocab: list[str], weights: list[int]) -> list[str]:
    n = len(words)
    op = rng.choice((0, 1, 2, 3) if n >= 4 else (0, 1, 3))  # a span needs at least 4 words to differ
    if op == 0:                                    # delete each word with p = 0.15, at least one
        keep = [w for w in words if rng.random() >= 0.15]
        if len(keep) == n:
            keep.pop(rng.randrange(n))
        return keep if len(keep) >= 2 else words[:2]
    if op == 1:                                    # swap 1 + n // 8 pairs
        out = list(words)
        for _ in range(1 + n // 8):
            i, j = rng.randrange(n), rng.randrange(n)
            out[i], out[j] = out[j], out[i]
        return out
    if op == 2:                                    # a contiguous span of at least half the words
        length = rng.randint(max(3, n // 2), n - 1)
        start = rng.randint(0, n - length)
        return words[start:start + length]
    out = list(words)                              # replace 15% of the words, at least one
    for i in rng.sample(range(n), max(1, round(0.15 * n))):
        out[i] = rng.choices(vocab, weights)[0]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", help="sentence<TAB>label file with a header line")
    ap.add_argument("out")
    ap.add_argument("--min-words", type=int, default=4, help="lines shorter than this get no copy")
    ap.add_argument("--copies", type=int, default=1, help="copies of each line (at most; duplicates are dropped)")
    ap.add_argument("--copies-long", type=int, default=15, help="lines with at least this many words get one more")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    rows = read_tsv(a.source)
    counts = Counter(w for s, _ in rows for w in s.split())
    vocab, weights = list(counts), list(counts.values())
    seen = {s for s, _ in rows}
    out = []
    for s, y in rows:
        words = s.split()
        if len(words) < a.min_words:
            continue
        for _ in range(a.copies + (len(words) >= a.copies_long)):
            for _try in range(5):                  # a copy equal to a seen line teaches nothing new
                t = " ".join(augment(words, rng, vocab, weights))
                if t not in seen:
                    seen.add(t)
                    out.append((t, y))
                    break
    tmp = Path(a.out + ".tmp")
    tmp.write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in out), encoding="utf-8")
    tmp.replace(a.out)
    print(f"{a.out}: {len(out)} copies of {len(rows)} lines")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
