"""Write the unlabeled text of the shared data sets as pretraining files, never the evaluated text.

    python examples/pretrain_corpus.py OUT_DIR        # then: attnlab tokenizer train ... OUT_DIR/*.txt
    python examples/pretrain_corpus.py OUT_DIR --repeat sst2-train-sentences=20 --repeat conll2003-train=3

`--repeat NAME=K` writes source NAME as K copies, each its own document (3 blank lines apart), so a
one-hour run sees the few in-domain sentences K times instead of once among 19th-century prose
(task-adaptive pretraining's point, Gururangan et al. 2020, folded into the main run). The copies are
identical, so with `heldout_mode: tail` every copy holds out the same last sentences: the held-out
text is still never trained on. Blocks are cut at different offsets in each copy (the packing runs
across documents), and the masks are drawn anew, so the copies are not identical examples.

One file per source, one document per file (sentences one per line, a blank line between documents
where the source has them). What is left out, and why:
  - SST-2: the 872 whole sentences `attnlab finetune sst2` holds out, and every phrase of them
    (attnlab's own `validation_split`, so it is exactly the evaluated part); of the rest only whole
    sentences are written (train.tsv also lists every phrase of each sentence: 67k lines, 6.9k sentences
    would otherwise be repeated many times over);
  - CoNLL-2003: train.txt only (fine-tuning evaluates on valid.txt);
  - CoLA, MRPC, RTE, STS-B: train.tsv only (their dev.tsv are the evaluated parts);
  - SQuAD: the contexts of the train*.json files, not dev.json; Multi30k: train.en, not val.en.
Gutenberg books, WikiText-2 and tiny Shakespeare are read by the recipe from $ATTNLAB_DATA directly.
"""
from __future__ import annotations

import csv
import json
import os
import sys
from pathlib import Path

from attnlab.tasks import get_task
from attnlab.tasks.splits import validation_split


def sst2_sentences(root: Path, holdout: int = 872) -> list[str]:
    task = get_task("sst2")
    examples = task.read(root / "glue" / "SST-2" / "train.tsv")
    train, held, _ = validation_split(task, examples, holdout)
    texts = sorted({" ".join(" ".join(ex["texts"]).split()) for ex in train}, key=len, reverse=True)
    inside: set[str] = set()   # keep a line only when no longer kept line contains it
    kept = []
    for text in texts:
        if text in inside:
            continue
        kept.append(text)
        words = text.split()
        inside.update(" ".join(words[a:b]) for a in range(len(words)) for b in range(a + 1, len(words) + 1))
    held_texts = {" ".join(" ".join(ex["texts"]).split()) for ex in held}
    assert not held_texts & set(kept), "an SST-2 held-out sentence reached the pretraining text"
    return kept


def tsv_column_texts(path: Path, columns: list[str], header: bool = True, index: list[int] = ()) -> list[str]:
    with open(path, encoding="utf-8-sig", newline="") as fh:
        rows = list(csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))
    if header:
        head, rows = rows[0], rows[1:]
        index = [head.index(c) for c in columns]
    return [row[i].strip() for row in rows for i in index if i < len(row) and row[i].strip()]


def conll_sentences(path: Path) -> list[str]:
    out, words = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("-DOCSTART-"):
            if words:
                out.append(" ".join(words))
            words = []
            if line.startswith("-DOCSTART-") and out and out[-1]:
                out.append("")  # document boundary
            continue
        words.append(line.split()[0])
    if words:
        out.append(" ".join(words))
    return out


def squad_contexts(root: Path) -> list[str]:
    out = []
    for path in sorted((root / "squad").glob("train*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        for article in data["data"]:
            for para in article["paragraphs"]:
                out += [para["context"].replace("\n", " "), ""]
    return out


def repeated_text(lines: list[str], k: int = 1) -> str:
    """`lines` as K identical documents: 3 blank lines end a document (attnlab.data.corpus, documents=auto)."""
    return "\n\n\n\n".join(["\n".join(lines) + "\n"] * k)


def main(out: Path, repeat: dict[str, int] | None = None) -> None:
    repeat = repeat or {}
    root = Path(os.environ.get("ATTNLAB_DATA", "../shared/data"))
    out.mkdir(parents=True, exist_ok=True)
    glue = root / "glue"
    parts = {
        "sst2-train-sentences": sst2_sentences(root),
        "conll2003-train": conll_sentences(root / "conll2003" / "train.txt"),
        "cola-train": tsv_column_texts(glue / "CoLA" / "train.tsv", [], header=False, index=[3]),
        "mrpc-train": tsv_column_texts(glue / "MRPC" / "train.tsv", ["#1 String", "#2 String"]),
        "rte-train": tsv_column_texts(glue / "RTE" / "train.tsv", ["sentence1", "sentence2"]),
        "stsb-train": tsv_column_texts(glue / "STS-B" / "train.tsv", ["sentence1", "sentence2"]),
        "multi30k-train-en": (root / "multi30k" / "train.en").read_text(encoding="utf-8").splitlines(),
        "squad-train-contexts": squad_contexts(root),
    }
    unknown = sorted(set(repeat) - set(parts))
    if unknown:
        sys.exit(f"--repeat {unknown[0]}: no such source; sources: {', '.join(parts)}")
    for name, lines in parts.items():
        k = repeat.get(name, 1)
        (out / f"{name}.txt").write_text(repeated_text(lines, k), encoding="utf-8")
        print(f"{name}: {sum(1 for x in lines if x)} lines, {sum(len(x.split()) for x in lines):,} words"
              + (f", written {k} times" if k > 1 else ""))


def _parse_repeat(items: list[str]) -> dict[str, int]:
    out = {}
    for item in items:
        name, _, k = item.partition("=")
        if not k.isdigit() or int(k) < 1:
            sys.exit(f"--repeat {item!r}: expected NAME=K with K a positive integer")
        out[name] = int(k)
    return out


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) < 1 or len(args) % 2 != 1 or any(a != "--repeat" for a in args[1::2]):
        sys.exit(__doc__)
    main(Path(args[0]), _parse_repeat(args[2::2]))
