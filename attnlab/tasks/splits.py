"""Which examples train and which validate: the training and validation files a task reads (several joined with
commas), and the validation part held out of a training file when there is no validation file. SST-2's file
holds every parsed phrase of its sentences, so its hold-out is whole sentences, none of whose phrases is trained
on (`sentence_holdout`); how many are held out is `defaults.holdout_size`."""
from __future__ import annotations

import random
from pathlib import Path

from .base import Task, data_root
from .common import DataError
from .defaults import DEFAULT_HOLDOUT, holdout_size


def holdout_split(examples: list, n_holdout: int, seed: int = 0) -> tuple[list, list]:
    """(train, held-out): a fixed, seeded choice, independent of the training seed, so that runs with
    different seeds are scored on the same held-out examples."""
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    held = set(order[:n_holdout])
    return [ex for i, ex in enumerate(examples) if i not in held], [examples[i] for i in sorted(held)]


def sentence_holdout(examples: list, n_holdout: int, seed: int = 0) -> tuple[list, list]:
    """(train, held-out) for a training file of phrases cut from sentences (SST-2's train.tsv holds every
    parsed phrase of its sentences: 88% of 872 randomly held-out lines occur inside a training line). Hold
    out whole sentences - lines no other line contains, like the real SST-2 dev set - and drop from training
    every line that is a phrase of a held-out sentence, so that no held-out text was seen in training."""
    texts = [" ".join(" ".join(ex["texts"]).split()) for ex in examples]
    known = set(texts)
    order = sorted(range(len(texts)), key=lambda i: (-len(texts[i]), i))
    inside: set[str] = set()   # lines that are a proper phrase of a longer line
    roots: list[int] = []
    for i in order:
        if texts[i] in inside:
            continue
        roots.append(i)
        inside.update(p for p in phrases(texts[i]) if p in known and p != texts[i])
    roots.sort()
    random.Random(seed).shuffle(roots)
    held = set(roots[:n_holdout])
    held_phrases = {p for i in held for p in phrases(texts[i])}
    train = [ex for i, ex in enumerate(examples) if i not in held and texts[i] not in held_phrases]
    return train, [examples[i] for i in sorted(held)]


def whole_sentences(examples: list) -> list:
    """The lines that are no phrase of another line (SST-2's whole sentences, what its dev set holds), in
    file order: the pool few-label draws come from."""
    texts = [" ".join(e["texts"][0].split()) for e in examples]
    known, inside, roots = set(texts), set(), []
    for i in sorted(range(len(texts)), key=lambda i: (-len(texts[i]), i)):
        if texts[i] not in inside:
            roots.append(i)
            inside.update(p for p in phrases(texts[i]) if p in known and p != texts[i])
    return [examples[i] for i in sorted(roots)]


def phrases(text: str):
    """Every contiguous run of words in `text` (the sentence itself included)."""
    words = text.split()
    return (" ".join(words[a:b]) for a in range(len(words)) for b in range(a + 1, len(words) + 1))


def validation_split(task: Task, examples: list, n_holdout: int, seed: int = 0) -> tuple[list, list, str]:
    """The held-out validation part of a task without a dev file: (train, held-out, description)."""
    if getattr(task, "phrase_level", False):
        train, held = sentence_holdout(examples, n_holdout, seed)
        return train, held, (f"{len(held)} whole sentences held out of the training file (seed {seed}; "
                             f"{len(examples) - len(train) - len(held)} of their phrases removed from training)")
    train, held = holdout_split(examples, n_holdout, seed)
    return train, held, f"{len(held)} examples held out of the training file (seed {seed})"


def read_many(task: Task, spec: str | Path) -> list[dict]:
    """One file, or several joined with commas (SQuAD's train*.json shards)."""
    examples = []
    for part in str(spec).split(","):
        examples += task.read(part)
    return examples


def report_file(task: Task, train_file=None, valid_file=None, test_file=None) -> str | None:
    """The task's own dev file (GLUE dev.tsv, CoNLL valid.txt, SQuAD dev.json) when a run was given no file of
    its own: a report set, scored once on the kept model and never used to choose it (checkpoints, epochs), so
    that its figure is one of data nobody tuned on. None when any file was given or there is none."""
    root = data_root()
    if train_file or valid_file or test_file or not task.valid_file or root is None:
        return None
    path = root / task.valid_file
    return str(path) if path.is_file() else None


def resolve_files(task: Task, train_file=None, valid_file=None, carve: bool = False) -> tuple[str, str | None]:
    """(training file, validation file or None: hold a part of the training file out). carve: hold out even
    when the task has a dev file (fine-tuning keeps that file as its report set, `report_file`)."""
    root = data_root()
    if not train_file and (task.train_file is None or root is None):
        raise DataError(f"{task.name}: no training file: pass --train FILE"
                        + (" (or set ATTNLAB_DATA)" if task.train_file else ""))
    train = str(train_file) if train_file else ",".join(str(root / part) for part in task.train_file.split(","))
    if valid_file:
        return train, str(valid_file)
    if train_file is None and task.valid_file and not carve:
        return train, str(root / task.valid_file)
    return train, None


def read_splits(task: Task, train_file=None, valid_file=None, holdout=None,
                max_train_samples: int | None = None, max_eval_samples: int | None = None, seed: int = 42,
                carve: bool = False):
    """(train path, train, validation examples, their description, a stderr note); see `holdout_size`.
    `holdout` may be a function of the training file's example count (the few-label rule decides on it);
    `carve`: see `resolve_files`."""
    train_path, valid_path = resolve_files(task, train_file, valid_file, carve)
    train_ex = read_many(task, train_path)
    if callable(holdout):
        holdout = holdout(len(train_ex))
    if valid_path is None and holdout == 0:  # nothing held out (the few-label rule; the caller says why)
        valid_ex, valid_desc, valid_note = [], None, "nothing held out"
    elif valid_path is None:
        n_file = len(train_ex)
        n_held = holdout if holdout is not None else holdout_size(n_file, DEFAULT_HOLDOUT)
        if n_held >= n_file:
            raise DataError(f"{train_path}: {n_file} examples, too few to hold {n_held} out for "
                            "validation; give a validation file (--valid)")
        train_ex, valid_ex, valid_desc = validation_split(task, train_ex, n_held)
        valid_note = f"{100 * len(valid_ex) / n_file:.0f}% held out of {train_path}: {valid_desc}"
    else:
        valid_ex, valid_desc, valid_note = read_many(task, valid_path), valid_path, f"from {valid_path}"
    subset = lambda ex, n: holdout_split(ex, n, seed)[1] if n and n < len(ex) else ex  # noqa: E731  (seeded)
    train_ex, valid_ex = subset(train_ex, max_train_samples), subset(valid_ex, max_eval_samples)
    if not train_ex:
        raise DataError(f"{train_path}: no training examples")
    return train_path, train_ex, valid_ex, valid_desc, valid_note
