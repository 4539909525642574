"""The few-label benchmark's data: report sets scored once per final recipe, and seeded draws of N labeled
sentences disjoint from them.

SST-2 has no dev file here and its train.tsv holds every parsed phrase of its sentences. attnlab sets aside
872 whole sentences as its own held-out set (`sentence_holdout`, seed 0: what `finetune` and the few-label
research score against, so the defaults were chosen on them). The benchmark must not score on those, so it
carves a second set of 872 whole sentences the same way (seed REPORT_SEED) from what is left, and draws
training sentences only from what is left after both (every phrase of either set removed). A draw is
N whole sentences sampled with `random.Random(draw_seed)`, as research/fewlabel/sst2_fewlabel.py draws them:
no stratification, so a draw's label balance is the pool's up to chance.

CoLA has a dev file: that is its report set; draws come from train.tsv lines whose text is not in it.

book, the task the defaults never saw (which of five Gutenberg books a passage of 1-3 sentences is from, as
benchmarks/glue_vs_transformers.py builds it): the report set is the 1,000 passages of the books' test
blocks, draws come from the 4,000 training passages. attnlab trains it as `text-classification` on a CSV
whose labels are the titles; the setfit side gets the titles' indices.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from attnlab.tasks import get_task
from attnlab.tasks.splits import sentence_holdout, validation_split, whole_sentences

PROJECT_HELD = 872      # the size of attnlab's own SST-2 hold-out (seed 0)
PROJECT_SEED = 0
REPORT_SIZE = 872       # the size of the benchmark's SST-2 report set
REPORT_SEED = 1


def _norm(text: str) -> str:
    return " ".join(text.split())


def sst2_split(examples: list[dict]) -> dict:
    """{"project": attnlab's own 872, "report": the benchmark's 872, "pool": whole sentences to draw from,
    "note": what was done, in words}. `examples`: SST-2's train.tsv as the task reads it."""
    rest, project, _ = validation_split(get_task("sst2"), examples, PROJECT_HELD, PROJECT_SEED)  # finetune's own
    rest2, report = sentence_holdout(rest, REPORT_SIZE, REPORT_SEED)
    pool = whole_sentences(rest2)
    note = (f"SST-2 report set: {len(report)} whole sentences of train.tsv (sentence_holdout seed {REPORT_SEED}), "
            f"disjoint from attnlab's own {len(project)} held-out sentences (seed {PROJECT_SEED}); draws come from "
            f"the {len(pool)} whole sentences left after both sets and every phrase inside them are removed "
            f"({len(examples) - len(rest2) - len(project) - len(report)} phrase lines dropped)")
    return {"project": project, "report": report, "pool": pool, "note": note}


def cola_split(train: list[dict], dev: list[dict]) -> dict:
    """CoLA: the report set is dev.tsv; the pool is train.tsv less any line whose text is also in dev."""
    dev_texts = {_norm(e["texts"][0]) for e in dev}
    pool = [e for e in train if _norm(e["texts"][0]) not in dev_texts]
    note = (f"CoLA report set: dev.tsv ({len(dev)} sentences); draws come from train.tsv "
            f"({len(pool)} of {len(train)} lines, {len(train) - len(pool)} also in dev.tsv dropped)")
    return {"project": [], "report": dev, "pool": pool, "note": note}


def draw(pool: list[dict], n: int, draw_seed: int) -> list[dict]:
    """N examples of `pool`, chosen by `draw_seed` alone (the same N for every recipe and training seed)."""
    if n > len(pool):
        raise ValueError(f"a draw of {n} examples from a pool of {len(pool)}")
    return random.Random(draw_seed).sample(pool, n)


def book_split(data: Path) -> dict:
    from _glue_data import BOOKS, book_rows
    titles = list(BOOKS.values())
    train, test = book_rows(data)
    as_examples = lambda rows: [{"texts": [text], "label": titles.index(title), "title": title}  # noqa: E731
                                for text, title, _ in rows]
    note = (f"book report set: the {len(test)} passages of the test blocks of {len(titles)} Gutenberg books; draws come "
            f"from the {len(train)} passages of their training blocks (benchmarks/_glue_data.py)")
    return {"project": [], "report": as_examples(test), "pool": as_examples(train), "note": note}


# the task attnlab's `finetune` and `evaluate` are given for each of the benchmark's tasks
ATTNLAB_TASK = {"sst2": "sst2", "cola": "cola", "book": "text-classification"}


def split_for(task_name: str, data: Path) -> dict:
    if task_name == "book":
        return book_split(data)
    task = get_task(task_name)
    train = task.read(data / task.train_file)
    if task_name == "sst2":
        return sst2_split(train)
    if task_name == "cola":
        return cola_split(train, task.read(data / task.valid_file))
    raise ValueError(f"task {task_name!r}: the benchmark knows sst2, cola and book")


def write_task_file(path: Path, task_name: str, examples: list[dict]) -> None:
    """`examples` as a file the task reads back: SST-2's `sentence<TAB>label` with its header, (CoLA) the
    examples' original lines of their source file (4 columns, no header), or (book) a `text,label` CSV with
    the titles as labels."""
    if task_name == "book":
        from _glue_data import write_csv
        write_csv(path, [(e["texts"][0], e["title"], 0) for e in examples])
        return
    if task_name != "sst2":
        lines: dict[str, list[str]] = {}
        out = []
        for e in examples:
            src = lines.setdefault(e["source"], Path(e["source"]).read_text(encoding="utf-8").split("\n"))
            out.append(src[e["line"] - 1].rstrip("\r") + "\n")
        path.write_text("".join(out), encoding="utf-8")
        return
    path.write_text("sentence\tlabel\n" + "".join(f"{e['texts'][0]}\t{e['label']}\n" for e in examples),
                    encoding="utf-8")


def write_plain(path: Path, examples: list[dict]) -> None:
    """What the setfit side reads (it runs in its own venv, without attnlab): one {"text", "label"} a line."""
    path.write_text("".join(json.dumps({"text": e["texts"][0].strip(), "label": int(e["label"])}) + "\n"
                            for e in examples), encoding="utf-8")
