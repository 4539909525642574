"""The data of glue_vs_transformers.py: which files each task trains and is scored on, SST-2's report set, and
the unseen task (which of five Gutenberg books a passage is from). Everything is built from the real files
under ATTNLAB_DATA with fixed seeds, so both sides and every training seed see the same examples.

Report sets are scored once per finished run and never used to choose anything."""
from __future__ import annotations

import csv
import random
import re
from dataclasses import dataclass
from pathlib import Path

from attnlab.interop.files import atomic_write

# task -> (attnlab task name, training file, report file or None, metrics shown): the report file is the GLUE dev
# set where there is one. SST-2 has none here, so its report set is carved out of its training file (sst2_split).
GLUE = {
    "rte": ("rte", "glue/RTE/train.tsv", "glue/RTE/dev.tsv", ("accuracy",)),
    "mrpc": ("mrpc", "glue/MRPC/train.tsv", "glue/MRPC/dev.tsv", ("f1", "accuracy")),
    "stsb": ("stsb", "glue/STS-B/train.tsv", "glue/STS-B/dev.tsv", ("pearson", "spearman")),
    "cola": ("cola", "glue/CoLA/train.tsv", "glue/CoLA/dev.tsv", ("mcc",)),
    "sst2": ("sst2", "glue/SST-2/train.tsv", None, ("accuracy",)),
    # not GLUE, the same protocol: NER against the Trainer with run_ner's recipe, valid.txt as the report set
    "conll2003": ("conll2003", "conll2003/train.txt", "conll2003/valid.txt", ("f1",)),
}
BOOK_TASK = "book"  # the unseen task, trained as the generic text-classification task
BOOK_METRICS = ("accuracy",)
# Two Austens and two Dickens, so that the author's style alone does not settle the answer.
BOOKS = {"158-0.txt": "Emma", "pg161.txt": "Sense and Sensibility", "1400-0.txt": "Great Expectations",
         "98-0.txt": "A Tale of Two Cities", "2701-0.txt": "Moby Dick"}
BOOK_TRAIN, BOOK_TEST = 800, 200   # passages per book: 4,000 train / 1,000 test
BOOK_BLOCKS, BOOK_TEST_BLOCKS = 10, 2  # each book is cut into 10 contiguous blocks; 2 of them are test
BOOK_GAP = 3  # training passages within this many positions of a test passage are dropped
SST2_REPORT = 872
DATA_SEED = 0  # the data is fixed; the training seeds only change training


@dataclass
class Prepared:
    """The files of one task as both sides get them."""
    name: str            # the benchmark's name for the task (rte, ..., book)
    attnlab_task: str    # the task `attnlab finetune` is given
    train: Path
    report: Path
    metrics: tuple[str, ...]
    note: str            # how the files were made, printed with the table


# ----------------------------------------------------------------------------------------------- GLUE files
def raw_lines(path: Path) -> list[str]:
    """The file's lines as attnlab's readers number them (1-based: raw_lines(p)[n - 1] is line n)."""
    from attnlab.tasks.common import iter_lines
    return [line for _, line in iter_lines(path)]


def write_lines(path: Path, header: str | None, lines: list[str]) -> Path:
    """Written whole or not at all (`atomic_write`): another benchmark instance may be reading the same file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(f"{line}\n" for line in ([header] if header is not None else []) + lines)
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return path


def subset(examples: list[dict], limit: int | None) -> list[dict]:
    """A seeded choice of `limit` examples in file order (all of them when limit is None or not smaller)."""
    if not limit or limit >= len(examples):
        return examples
    chosen = sorted(random.Random(DATA_SEED).sample(range(len(examples)), limit))
    return [examples[i] for i in chosen]


def write_examples(path: Path, source: Path, examples: list[dict], header: bool) -> Path:
    """The examples' own lines of `source` (they were read from it), under its header: the same format."""
    lines = raw_lines(source)
    return write_lines(path, lines[0] if header else None, [lines[ex["line"] - 1] for ex in examples])


def write_conll(path: Path, examples: list[dict]) -> Path:
    """Sentences of a CoNLL-2003 file as CoNLL lines (word, two unused columns, tag), a blank line after each."""
    lines = []
    for ex in examples:
        lines += [f"{w} _ _ {t}" for w, t in zip(ex["words"], ex["tags"])] + [""]
    return write_lines(path, None, lines)


def normalized(ex: dict) -> str:
    return " ".join(" ".join(ex["texts"]).split())


def sst2_split(examples: list[dict], n_report: int = SST2_REPORT) -> tuple[list[dict], list[dict], list[dict]]:
    """(training file, report set, finetune's own held-out set) for SST-2, whose dev set is not here.

    finetune's default hold-out of the full file (`validation_split`, 872 whole sentences) is the set the
    defaults were measured on, so the report set is carved, the same clean way (`sentence_holdout`: whole
    sentences no other line contains), from what is left once those and their phrases are gone, with another
    seed. The training file both sides get is the full file without the report sentences and without every
    line that is a phrase of one of them (finetune then holds out its own validation part of that file)."""
    from attnlab.tasks import get_task
    from attnlab.tasks.splits import phrases, sentence_holdout, validation_split
    rest, project_held, _ = validation_split(get_task("sst2"), examples, n_report)
    _, report = sentence_holdout(rest, n_report, seed=DATA_SEED + 1)
    report_phrases = {p for ex in report for p in phrases(normalized(ex))}
    train = [ex for ex in examples if normalized(ex) not in report_phrases]
    return train, report, project_held


def prepare_glue(name: str, root: Path, out: Path, limit_train: int | None, limit_report: int | None) -> Prepared:
    from attnlab.tasks import get_task
    attnlab_task, train_rel, report_rel, metrics = GLUE[name]
    task = get_task(attnlab_task)
    train_src = root / train_rel
    if report_rel is None:  # SST-2
        train, report, _ = sst2_split(task.read(train_src))
        n_full = len(raw_lines(train_src)) - 1
        note = (f"sst2: no dev set here; the report set is {len(report)} whole sentences carved out of train.tsv "
                f"(disjoint from finetune's own 872 of the full file), and the training file is train.tsv without "
                f"them and without their {n_full - len(train) - len(report)} phrases ({len(train)} lines)")
        train, report = subset(train, limit_train), subset(report, limit_report)
        return Prepared(name, attnlab_task, write_examples(out / "train.tsv", train_src, train, True),
                        write_examples(out / "report.tsv", train_src, report, True), metrics,
                        note + (f"; limited to {len(train)} / {len(report)}" if limit_train or limit_report else ""))
    report_src = root / report_rel
    if not limit_train and not limit_report:
        return Prepared(name, attnlab_task, train_src, report_src, metrics, f"{name}: {train_rel}, dev {report_rel}")
    train = subset(task.read(train_src), limit_train)
    report = subset(task.read(report_src), limit_report)
    if "words" in train[0]:  # CoNLL: an example is a block of lines
        return Prepared(name, attnlab_task, write_conll(out / "train.txt", train), write_conll(out / "report.txt", report),
                        metrics, f"{name}: {len(train)} sentences of {train_rel}, {len(report)} of {report_rel} "
                        "(seeded subsets)")
    return Prepared(name, attnlab_task, write_examples(out / "train.tsv", train_src, train, task.header),
                    write_examples(out / "report.tsv", report_src, report, task.header), metrics,
                    f"{name}: {len(train)} of {train_rel}, {len(report)} of {report_rel} (seeded subsets)")


# ------------------------------------------------------------------------------------------ the unseen task
# A sentence ends at . ! or ? (perhaps closed by a quote or bracket) before a capital or an opening quote,
# except after the titles these novels use all the time.
_SENTENCE_END = re.compile(r"(?<!\bMr\.)(?<!\bMrs\.)(?<!\bDr\.)(?<!\bSt\.)(?<!\bMessrs\.)"
                           r"(?:(?<=[.!?])|(?<=[.!?][\"'”’)]))\s+(?=[\"'“‘(]?[A-Z])")


# the transcribers' notes before the text: they name the book or its edition
_FRONT_MATTER = re.compile(r"Gutenberg|etext|^Produced by|proofreading", re.IGNORECASE)


def book_body(text: str) -> str:
    """The book without Project Gutenberg's header and licence."""
    start = text.find("*** START OF")
    start = text.find("\n", start) + 1 if start >= 0 else 0
    ends = [i for i in (text.find(m, start) for m in ("*** END OF", "End of the Project Gutenberg",
                                                      "End of Project Gutenberg")) if i >= 0]
    return text[start:min(ends, default=len(text))]


def book_passages(text: str, seed: int = DATA_SEED) -> list[str]:
    """Passages of 1-3 consecutive sentences of one paragraph (the count drawn per passage), in book order;
    those under 8 words, mostly capitals (headings, the table of contents) or transcribers' notes are left out."""
    rng = random.Random(seed)
    passages = []
    for para in re.split(r"\n\s*\n", book_body(text)):
        sentences = _SENTENCE_END.split(" ".join(para.replace("_", "").split()))
        i = 0
        while i < len(sentences):
            k = rng.randint(1, 3)
            passage = " ".join(sentences[i:i + k]).strip()
            i += k
            letters = [c for c in passage if c.isalpha()]
            if (len(passage.split()) >= 8 and sum(c.isupper() for c in letters) < 0.2 * len(letters)
                    and not _FRONT_MATTER.search(passage)):
                passages.append(passage)
    return passages


def block_split(n: int, seed: int = DATA_SEED, blocks: int = BOOK_BLOCKS, test_blocks: int = BOOK_TEST_BLOCKS,
                gap: int = BOOK_GAP) -> tuple[list[int], list[int]]:
    """(train positions, test positions) of n passages in book order: the book is cut into `blocks` contiguous
    blocks, `test_blocks` of them (a seeded choice) are test, and training passages within `gap` positions of a
    test passage are dropped, so that no test passage has a training passage for a neighbour."""
    bounds = [round(b * n / blocks) for b in range(blocks + 1)]
    chosen = set(random.Random(seed).sample(range(blocks), test_blocks))
    test = [i for b in sorted(chosen) for i in range(bounds[b], bounds[b + 1])]
    near = {j for i in test for j in range(i - gap, i + gap + 1)}
    train = [i for i in range(n) if i not in near]
    return train, test


def book_rows(root: Path, n_train: int = BOOK_TRAIN, n_test: int = BOOK_TEST,
              seed: int = DATA_SEED) -> tuple[list[tuple[str, str, int]], list[tuple[str, str, int]]]:
    """(train rows, test rows), each (text, book name, position of the passage in its book), n_train and
    n_test per book, drawn (seeded) from the book's training and test blocks; test passages whose text also
    occurs in training are left out."""
    train_rows, test_rows = [], []
    for file, title in BOOKS.items():
        passages = book_passages((root / "gutenberg" / file).read_text(encoding="utf-8-sig"), seed)
        train_pos, test_pos = block_split(len(passages), seed)
        rng = random.Random(f"{seed}-{file}")
        train_pos = sorted(rng.sample(train_pos, min(n_train, len(train_pos))))
        seen = {passages[i] for i in train_pos}
        test_pos = sorted(rng.sample([i for i in test_pos if passages[i] not in seen], min(n_test, len(test_pos))))
        train_rows += [(passages[i], title, i) for i in train_pos]
        test_rows += [(passages[i], title, i) for i in test_pos]
    random.Random(seed).shuffle(train_rows)
    return train_rows, test_rows


def write_csv(path: Path, rows: list[tuple[str, str, int]]) -> Path:
    """Written whole or not at all, as `write_lines`."""
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(["text", "label"])
            writer.writerows((text, label) for text, label, _ in rows)
    atomic_write(path, write)
    return path


def prepare_book(root: Path, out: Path, limit_train: int | None, limit_report: int | None) -> Prepared:
    train, test = book_rows(root)
    train, test = subset(train, limit_train), subset(test, limit_report)
    note = (f"book (unseen task): which of {len(BOOKS)} Gutenberg books ({', '.join(BOOKS.values())}) a passage of "
            f"1-3 sentences (>= 8 words) is from; {len(train)} train / {len(test)} test passages, split by "
            f"contiguous blocks of each book ({BOOK_TEST_BLOCKS} of {BOOK_BLOCKS} blocks test, a gap of {BOOK_GAP} "
            f"passages at their edges); attnlab trains it as text-classification on the CSV")
    return Prepared(BOOK_TASK, "text-classification", write_csv(out / "train.csv", train),
                    write_csv(out / "test.csv", test), BOOK_METRICS, note)


def prepare(name: str, root: Path, work: Path, limit_train: int | None = None,
            limit_report: int | None = None) -> Prepared:
    out = work / "data" / name
    if name == BOOK_TASK:
        return prepare_book(root, out, limit_train, limit_report)
    if name not in GLUE:
        raise SystemExit(f"--tasks: unknown task {name!r}; choose from {', '.join([*GLUE, BOOK_TASK])}")
    return prepare_glue(name, root, out, limit_train, limit_report)
