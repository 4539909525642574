"""GLUE sentence and sentence-pair tasks (Wang et al. 2019), read from the original GLUE tsv files.

Each task is data: which columns hold the sentence(s) and the label, whether the file has a header, and
which metrics it reports. A pair is encoded as [CLS] A [SEP] B [SEP] with segment ids 0/1 (BERT §3).

| task | columns (0-based)            | header | label           | metrics               |
| sst2 | sentence=0, label=1          | yes    | 0 / 1           | accuracy              |
| cola | sentence=3, label=1          | no     | 0 / 1           | Matthews corr.        |
| mrpc | #1=3, #2=4, label=0          | yes (BOM) | 0 / 1        | accuracy, F1 of 1     |
| rte  | s1=1, s2=2, label=3          | yes    | (not_)entailment | accuracy             |
| stsb | s1=7, s2=8, score=9          | yes    | 0.0 .. 5.0      | Pearson, Spearman     |

Fields are split on tabs only: GLUE text contains quote characters that are not CSV quoting.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .base import Task, check_label, labels_of
from .common import DataError, accuracy, f1_binary, iter_lines, matthews_corrcoef, pearson, run_model, spearman


@dataclass
class GlueTask(Task):
    columns: tuple[int, ...] = (0,)      # sentence A[, sentence B]
    label_column: int = 1
    header: bool = True
    regression: bool = False
    metrics: tuple[str, ...] = ("accuracy",)
    phrase_level: bool = False           # the training file holds phrases of its sentences (SST-2)

    # ---- reading
    def read(self, path: str | Path, with_labels: bool = True) -> list[dict]:
        path = Path(path)
        names = ["sentence"] if len(self.columns) == 1 else ["sentence1", "sentence2"]
        need = max(self.columns + ((self.label_column,) if with_labels else ()))
        examples = []
        for number, line in iter_lines(path):
            if (number == 1 and self.header) or not line.strip():
                continue
            fields = line.split("\t")
            if len(fields) <= need:
                wanted = dict(zip(self.columns, names))
                if with_labels:
                    wanted[self.label_column] = "label"
                missing = [f"{wanted[c]} (column {c + 1})" for c in sorted(wanted) if c >= len(fields)]
                raise DataError(f"{path}:{number}: missing column {', '.join(missing)}; the line has "
                                f"{len(fields)} tab-separated field(s), {self.name} needs {need + 1}")
            ex = {"texts": [fields[c] for c in self.columns], "line": number, "source": str(path)}
            if with_labels:
                ex["label"] = fields[self.label_column].strip()
                if self.regression:
                    try:
                        ex["label"] = float(ex["label"])
                    except ValueError:
                        raise DataError(f"{path}:{number}: score (column {self.label_column + 1}) "
                                        f"{ex['label']!r} is not a number") from None
            examples.append(ex)
        if not examples:
            raise DataError(f"{path}: no examples found")
        return examples

    def read_inputs(self, path: str | Path) -> list[dict]:
        """Plain text, one input per line; a pair task takes the two sentences separated by a tab."""
        examples = []
        for number, line in iter_lines(path):
            texts = line.split("\t")
            if len(texts) != len(self.columns):
                raise DataError(f"{path}:{number}: {self.name} takes {len(self.columns)} tab-separated "
                                f"sentence(s) per line, found {len(texts)}")
            examples.append({"texts": texts, "line": number, "source": str(path)})
        return examples

    def label_list(self, examples: list[dict]) -> list[str] | None:
        return None if self.regression else sorted({ex["label"] for ex in examples})

    def model_extra(self, labels: list[str] | None) -> dict:
        if self.regression:  # one output; HF names the problem type so its loss matches ours
            return dict(num_labels=1, problem_type="regression", id2label={"0": "score"}, label2id={"score": 0})
        return super().model_extra(labels)

    # ---- features
    def features(self, examples, tokenizer, max_length, label2id, training) -> list[dict]:
        texts = [tuple(ex["texts"]) if len(ex["texts"]) > 1 else ex["texts"][0] for ex in examples]
        enc = tokenizer(texts, max_length=max_length, truncation=True)
        feats = []
        for i, ex in enumerate(examples):
            f = {"input_ids": enc["input_ids"][i], "token_type_ids": enc["token_type_ids"][i], "example": i}
            if "label" in ex:
                f["labels"] = float(ex["label"]) if self.regression else \
                    check_label(ex["label"], label2id, f"{ex['source']}:{ex['line']}")
            feats.append(f)
        return feats

    # ---- scoring
    def predict(self, model, tokenizer, examples, max_length, batch_size=64, progress=False) -> list:
        labels, label2id = labels_of(model)
        feats = self.features([{k: v for k, v in ex.items() if k != "label"} for ex in examples],
                              tokenizer, max_length, label2id, training=False)
        logits = torch.stack(run_model(model, feats, tokenizer.pad_token_id, batch_size, progress))
        if self.regression:
            return [round(float(v), 4) for v in logits[:, 0]]
        return [labels[i] for i in logits.argmax(-1).tolist()]

    def score(self, examples, predictions) -> dict[str, float]:
        gold = [ex["label"] for ex in examples]
        if self.regression:
            return {"pearson": 100 * pearson(predictions, gold), "spearman": 100 * spearman(predictions, gold)}
        out = {}
        binary = lambda seq: [1 if str(v) in ("1", "entailment") else 0 for v in seq]  # noqa: E731
        for name in self.metrics:
            if name == "accuracy":
                out["accuracy"] = 100 * accuracy(predictions, gold)
            elif name == "f1":
                out["f1"] = 100 * f1_binary(binary(predictions), binary(gold))
            elif name == "mcc":
                out["mcc"] = 100 * matthews_corrcoef(binary(predictions), binary(gold))
        return out


# Defaults chosen for a 6-layer MiniLM on CPU; larger lr than BERT-base's 2e-5 suits small models.
GLUE_TASKS: dict[str, GlueTask] = {
    "sst2": GlueTask("sst2", "BertForSequenceClassification", "accuracy", "glue/SST-2/train.tsv", None,
                     hyper=dict(epochs=1, lr=5e-5, batch_size=32, max_length=64),
                     columns=(0,), label_column=1, phrase_level=True, label_names={"0": "negative", "1": "positive"}),
    "cola": GlueTask("cola", "BertForSequenceClassification", "mcc", "glue/CoLA/train.tsv", "glue/CoLA/dev.tsv",
                     hyper=dict(epochs=3, lr=5e-5, batch_size=32, max_length=64),
                     columns=(3,), label_column=1, header=False, metrics=("mcc", "accuracy"),
                     label_names={"0": "unacceptable", "1": "acceptable"}),
    "mrpc": GlueTask("mrpc", "BertForSequenceClassification", "f1", "glue/MRPC/train.tsv", "glue/MRPC/dev.tsv",
                     hyper=dict(epochs=3, lr=5e-5, batch_size=16, max_length=128),
                     columns=(3, 4), label_column=0, metrics=("accuracy", "f1")),
    "rte": GlueTask("rte", "BertForSequenceClassification", "accuracy", "glue/RTE/train.tsv", "glue/RTE/dev.tsv",
                    hyper=dict(epochs=3, lr=5e-5, batch_size=16, max_length=128),
                    columns=(1, 2), label_column=3),
    "stsb": GlueTask("stsb", "BertForSequenceClassification", "spearman", "glue/STS-B/train.tsv",
                     "glue/STS-B/dev.tsv", hyper=dict(epochs=3, lr=5e-5, batch_size=16, max_length=128),
                     columns=(7, 8), label_column=9, regression=True, metrics=("pearson", "spearman")),
}
