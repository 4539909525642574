"""Tasks named for what the user brings, read from the user's own files (as transformers' pipelines name them).

| task                          | file                                    | columns / keys (auto-detected)         |
| text-classification           | CSV, TSV or JSONL with a header / keys  | text, label (any label names)          |
| sentence-pair-classification  | the same                                | text, text pair, label                 |
| regression                    | the same                                | text[, text pair], label (a number)    |
| token-classification          | CoNLL (`word ... TAG` lines) or JSONL   | tokens, tags                           |
| question-answering            | SQuAD json                              |                                        |

A .csv file is read as CSV (quotes allowed), .jsonl / .ndjson as one JSON object per line, anything else as
tab-separated fields with a header row (split on tabs only, as GLUE's files). Column names are chosen with
`with_columns` (the CLI's --text-column, --text-pair-column, --label-column); unset, the first header name of
TEXT_NAMES / PAIR_NAMES / LABEL_NAMES found is used. Labels are whatever the file holds (strings or integers);
their names are saved with the model (config.json id2label), so predictions come back as those names.
The benchmark tasks (sst2, cola, mrpc, rte, stsb, conll2003, squad) are presets of these with fixed files.
"""
from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, replace
from pathlib import Path

from .base import Task, check_label
from .common import DataError, accuracy, iter_lines
from .glue import GlueTask
from .ner import NERTask, entity_scores, read_conll
from .qa import SQUAD, QATask

TEXT_NAMES = ("text", "sentence", "sentence1", "text_a", "text1", "premise", "question", "content", "review")
PAIR_NAMES = ("text_pair", "sentence2", "text_b", "text2", "hypothesis", "answer")
LABEL_NAMES = ("label", "labels", "score", "class", "category", "target")
TOKEN_NAMES = ("tokens", "words")
TAG_NAMES = ("tags", "ner_tags", "labels", "label")


def read_rows(path: str | Path) -> list[tuple[int, dict]]:
    """(line number, {column: value}) per record of a CSV, TSV or JSONL file; CSV/TSV need a header row."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    suffix = path.suffix.lower()
    rows: list[tuple[int, dict]] = []
    if suffix in (".jsonl", ".ndjson"):
        for number, line in iter_lines(path):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{path}:{number}: not valid JSON (column {err.colno}: {err.msg})") from None
            if not isinstance(record, dict):
                raise DataError(f"{path}:{number}: expected a JSON object per line, got {type(record).__name__}")
            rows.append((number, record))
        return rows
    if suffix == ".csv":
        try:
            text = path.read_text(encoding="utf-8-sig")
        except UnicodeDecodeError as err:
            raise DataError(f"{path}: not valid UTF-8 (byte offset {err.start})") from None
        reader = csv.reader(io.StringIO(text, newline=""))  # quoted fields may hold newlines
        records, end = [], 0
        try:
            for fields in reader:  # a record starts on the line after the previous one ended
                records.append((end + 1, fields))
                end = reader.line_num
        except csv.Error as err:
            raise DataError(f"{path}:{reader.line_num}: not valid CSV ({err})") from None
    else:
        records = [(number, line.split("\t")) for number, line in iter_lines(path)]
    records = [(n, f) for n, f in records if any(x.strip() for x in f)]
    if not records:
        raise DataError(f"{path}: no header row and no examples")
    (_, header), body = records[0], records[1:]
    header = [h.strip() for h in header]
    for number, fields in body:
        if len(fields) != len(header):
            raise DataError(f"{path}:{number}: {len(fields)} field(s), but the header row has {len(header)} "
                            f"({', '.join(header)})")
        rows.append((number, dict(zip(header, fields))))
    return rows


def pick_column(path, keys, given: str | None, candidates: tuple[str, ...], option: str,
                required: bool = True) -> str | None:
    """The column to read: `given` (which must exist), else the first of `candidates` present (any case)."""
    keys = list(keys)
    if given is not None:
        if given not in keys:
            raise DataError(f"{path}: no column {given!r} ({option}); the columns are {', '.join(keys)}")
        return given
    lower = {k.lower(): k for k in keys}
    for name in candidates:
        if name in lower:
            return lower[name]
    if required:
        raise DataError(f"{path}: none of the columns {', '.join(keys)} is one of {', '.join(candidates)}; "
                        f"name it with {option}")
    return None


def _number_order(labels: set[str]) -> list[str]:
    """Sorted label names; integers in numeric order (2 before 10), so ids follow the file's own numbering."""
    try:
        return sorted(labels, key=int)
    except ValueError:
        return sorted(labels)


@dataclass
class TableTask(GlueTask):
    """Sentence (or sentence-pair) classification or regression on named columns of the user's file."""
    text_column: str | None = None
    text_pair_column: str | None = None
    label_name: str | None = None       # the label's column (GlueTask's label_column is a position)
    pair: bool | None = False           # True: a pair is required; None: read one when the file has it

    def _columns(self, path, keys, with_labels: bool) -> tuple[str, str | None, str | None]:
        text = pick_column(path, keys, self.text_column, TEXT_NAMES, "--text-column")
        pair = None
        if self.pair is not False or self.text_pair_column:
            pair = pick_column(path, [k for k in keys if k != text], self.text_pair_column, PAIR_NAMES,
                               "--text-pair-column", required=self.pair is True)
        label = pick_column(path, keys, self.label_name, LABEL_NAMES, "--label-column") if with_labels else None
        return text, pair, label

    def read(self, path: str | Path, with_labels: bool = True) -> list[dict]:
        rows = read_rows(path)
        if not rows:
            raise DataError(f"{path}: no examples found")
        keys = list(rows[0][1]) if not str(path).lower().endswith((".jsonl", ".ndjson")) else \
            list(dict.fromkeys(k for _, r in rows for k in r))
        text, pair, label = self._columns(path, keys, with_labels)
        examples = []
        for number, row in rows:
            texts = [self._text(path, number, row, text)] + ([self._text(path, number, row, pair)] if pair else [])
            ex = {"texts": texts, "line": number, "source": str(path)}
            if label is not None:
                ex["label"] = self._label(path, number, row, label)
            examples.append(ex)
        return examples

    @staticmethod
    def _text(path, number, row, column) -> str:
        value = row.get(column)
        if value is None or isinstance(value, (dict, list, bool)):
            raise DataError(f"{path}:{number}: column {column!r} is "
                            f"{'missing' if value is None else 'not text: ' + type(value).__name__}")
        return str(value)

    def _label(self, path, number, row, column):
        value = row.get(column)
        if isinstance(value, str):
            value = value.strip()
        if value is None or value == "":
            raise DataError(f"{path}:{number}: column {column!r} (the label) is empty")
        if self.regression:
            try:
                if isinstance(value, bool):
                    raise ValueError
                return float(value)
            except (TypeError, ValueError):
                raise DataError(f"{path}:{number}: column {column!r}: {value!r} is not a number "
                                f"({self.name} needs a numeric label)") from None
        if isinstance(value, (dict, list)):
            raise DataError(f"{path}:{number}: column {column!r}: a label must be a string or a number, "
                            f"got {type(value).__name__}")
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # JSON 1.0 and 1 are one class
        return str(value)

    def read_inputs(self, path: str | Path) -> list[dict]:
        """A file with a header / keys (CSV, JSONL, a TSV whose header names the text column; its label column,
        if any, is ignored), else plain text: one input per line, the two texts of a pair tab-separated."""
        suffix = Path(path).suffix.lower()
        if suffix in (".csv", ".jsonl", ".ndjson") or (suffix == ".tsv" and self._has_header(path)):
            return self.read(path, with_labels=False)
        want = (1,) if self.pair is False else (2,) if self.pair else (1, 2)
        examples = []
        for number, line in iter_lines(path):
            if not line.strip():
                continue
            texts = line.split("\t")
            if len(texts) not in want:
                raise DataError(f"{path}:{number}: {self.name} takes {' or '.join(map(str, want))} "
                                f"tab-separated text(s) per line, found {len(texts)}")
            examples.append({"texts": texts, "line": number, "source": str(path)})
        return examples

    def _has_header(self, path) -> bool:
        first = next((line for _, line in iter_lines(path) if line.strip()), "")
        names = [f.strip() for f in first.split("\t")]
        return (self.text_column in names) if self.text_column else any(n.lower() in TEXT_NAMES for n in names)

    def label_list(self, examples: list[dict]) -> list[str] | None:
        return None if self.regression else _number_order({ex["label"] for ex in examples})

    def score(self, examples, predictions) -> dict[str, float]:
        if self.regression:
            return super().score(examples, predictions)
        gold = [ex["label"] for ex in examples]
        return {"accuracy": 100 * accuracy(predictions, gold), "macro_f1": 100 * macro_f1(predictions, gold)}


def macro_f1(pred, gold) -> float:
    """The mean over the gold classes of each class's F1 (every class weighs the same, however rare)."""
    scores = []
    for c in sorted(set(gold)):
        tp = sum(p == c and g == c for p, g in zip(pred, gold))
        fp = sum(p == c and g != c for p, g in zip(pred, gold))
        fn = sum(p != c and g == c for p, g in zip(pred, gold))
        scores.append(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
    return sum(scores) / max(len(scores), 1)


_BIO_PREFIXES = ("B-", "I-", "E-", "S-", "L-", "U-")


@dataclass
class TokenTask(NERTask):
    """Tags per word: CoNLL-style files (word ... TAG per line, a blank line between sentences), or JSONL with a
    list of tokens and a list of tags (strings or integers) per line."""
    text_column: str | None = None      # the tokens' key of a JSONL file
    label_name: str | None = None       # the tags' key

    def _jsonl(self, path) -> bool:
        return Path(path).suffix.lower() in (".jsonl", ".ndjson")

    def read(self, path, with_tags: bool = True) -> list[dict]:
        if not self._jsonl(path):
            return read_conll(path, with_tags=with_tags)
        examples = []
        for number, row in read_rows(path):
            tokens_key = pick_column(path, row, self.text_column, TOKEN_NAMES, "--text-column")
            tokens = row[tokens_key]
            if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens) or not tokens:
                raise DataError(f"{path}:{number}: {tokens_key!r} must be a non-empty list of strings")
            ex = {"words": tokens, "line": number, "source": str(path), "jsonl": True}
            if with_tags:
                tags_key = pick_column(path, [k for k in row if k != tokens_key], self.label_name, TAG_NAMES,
                                       "--label-column")
                tags = row[tags_key]
                if not isinstance(tags, list) or len(tags) != len(tokens):
                    raise DataError(f"{path}:{number}: {tags_key!r} must be a list of {len(tokens)} tags, one per "
                                    f"token; found {len(tags) if isinstance(tags, list) else type(tags).__name__}")
                ex["tags"] = [str(t) for t in tags]
            examples.append(ex)
        if not examples:
            raise DataError(f"{path}: no sentences found")
        return examples

    def read_inputs(self, path) -> list[dict]:
        return self.read(path, with_tags=False)

    def label_list(self, examples) -> list[str]:
        return _number_order({t for ex in examples for t in ex["tags"]})

    def features(self, examples, tokenizer, max_length, label2id, training) -> list[dict]:
        for ex in examples:  # CoNLL lines name their own line; a JSONL line names the tag's index in it
            if ex.get("jsonl") and "tags" in ex:
                for j, tag in enumerate(ex["tags"]):
                    check_label(tag, label2id, f"{ex['source']}:{ex['line']}: tag {j + 1}")
        return super().features(examples, tokenizer, max_length, label2id, training)

    def score(self, examples, predictions) -> dict[str, float]:
        gold = [ex["tags"] for ex in examples]
        if all(t == "O" or t.startswith(_BIO_PREFIXES) for tags in gold for t in tags):
            return entity_scores(gold, predictions)
        # tags that are not entity spans (part of speech, ints): per-token accuracy and macro F1 over tags
        flat_gold = [t for tags in gold for t in tags]
        flat_pred = [t for tags in predictions for t in tags]
        return {"f1": 100 * macro_f1(flat_pred, flat_gold), "accuracy": 100 * accuracy(flat_pred, flat_gold)}


_HYPER = dict(epochs=3, lr=5e-5, batch_size=32, max_length=128)
USER_TASKS: dict[str, Task] = {
    "text-classification": TableTask("text-classification", "BertForSequenceClassification", "accuracy", None, None,
                                     hyper=dict(_HYPER), columns=(0,)),
    "sentence-pair-classification": TableTask("sentence-pair-classification", "BertForSequenceClassification",
                                              "accuracy", None, None, hyper=dict(_HYPER), columns=(0, 1), pair=True),
    "regression": TableTask("regression", "BertForSequenceClassification", "spearman", None, None,
                            hyper=dict(_HYPER), regression=True, metrics=("pearson", "spearman"), pair=None),
    "token-classification": TokenTask("token-classification", "BertForTokenClassification", "f1", None, None,
                                      hyper=dict(epochs=3, lr=1e-4, batch_size=32, max_length=128)),
    "question-answering": QATask("question-answering", "BertForQuestionAnswering", "f1", None, None,
                                 hyper=dict(SQUAD.hyper)),
}


def with_columns(task: Task, text: str | None = None, pair: str | None = None, label: str | None = None) -> Task:
    """`task` reading the named columns (None: auto-detected); the benchmark presets read fixed columns."""
    given = {"--text-column": text, "--text-pair-column": pair, "--label-column": label}
    options = [k for k, v in given.items() if v is not None]
    if not options:
        return task
    if isinstance(task, TableTask):
        if pair is not None and task.regression is False and task.pair is False:
            task = replace(task, pair=True, columns=(0, 1))  # text-classification of pairs
        return replace(task, text_column=text, text_pair_column=pair, label_name=label)
    if isinstance(task, TokenTask) and pair is None:
        return replace(task, text_column=text, label_name=label)
    takers = "text-classification, sentence-pair-classification, regression" + \
        ("" if pair is not None else ", token-classification")
    raise ValueError(f"{task.name}: {', '.join(options)} is for the tasks that read the user's columns "
                     f"({takers}); {task.name} reads its own fixed format")
