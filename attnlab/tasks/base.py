"""The shape every task has: read a file into examples, turn examples into features, score a model on
examples, and write predictions. `finetune`, `evaluate` and `predict` only talk to this interface."""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..data.root import data_root  # noqa: F401  (re-exported: attnlab.tasks.data_root)
from .common import DataError


@dataclass
class Task:
    name: str
    architecture: str                     # the head wrapper, by its Hugging Face name
    main_metric: str                      # early stopping and "best" follow this key (higher is better)
    train_file: str | None                # default files, relative to data_root(); None: the user's --train only
    valid_file: str | None                # None: carve a held-out part out of train (seeded)
    hyper: dict[str, Any] = field(default_factory=dict)  # per-task defaults for finetune
    # {label: name} for labels that are numbers or codes ("0": "negative"): what an LM teacher's prompt reads
    label_names: dict[str, str] | None = None

    # ---- data
    def read(self, path: str | Path) -> list[dict]:
        raise NotImplementedError

    def label_list(self, examples: list[dict]) -> list[str] | None:
        """Class names seen in training, sorted so that ids are reproducible; None for regression/QA."""
        return None

    def model_extra(self, labels: list[str] | None) -> dict:
        """Values for config.json so that the saved model carries its label names."""
        if labels is None:
            return {}
        return dict(id2label={str(i): l for i, l in enumerate(labels)},
                    label2id={l: i for i, l in enumerate(labels)}, num_labels=len(labels))

    def features(self, examples: list[dict], tokenizer, max_length: int, label2id: dict | None,
                 training: bool) -> list[dict]:
        raise NotImplementedError

    # ---- scoring
    def predict(self, model, tokenizer, examples: list[dict], max_length: int, batch_size: int = 64,
                progress: bool = False) -> list:
        """One prediction per example (a label name, a score, a tag list, an answer string)."""
        raise NotImplementedError

    def score(self, examples: list[dict], predictions: list) -> dict[str, float]:
        raise NotImplementedError

    def write_predictions(self, examples: list[dict], predictions: list, path: Path) -> None:
        path.write_text("".join(f"{p}\n" for p in predictions), encoding="utf-8")

    def read_inputs(self, path: str | Path) -> list[dict]:
        """Examples to predict for, without labels (`attnlab predict`)."""
        raise NotImplementedError


def labels_of(model) -> tuple[list[str], dict[str, int]]:
    """(id -> name list, name -> id) from a model's config.json values."""
    id2label = model.config.extra.get("id2label") or {}
    labels = [id2label[k] for k in sorted(id2label, key=int)]
    return labels, {l: i for i, l in enumerate(labels)}


def check_label(label: str, label2id: dict, where: str) -> int:
    if label not in label2id:
        raise DataError(f"{where}: label {label!r} was not seen in training (known: {', '.join(label2id)})")
    return label2id[label]


# task name -> (module, attribute): modules are imported on first use (a task module imports this one).
# The generic tasks read the user's own files; the benchmark names are presets of them with default files.
_WHERE = {"text-classification": ("user", "USER_TASKS"), "sentence-pair-classification": ("user", "USER_TASKS"),
          "regression": ("user", "USER_TASKS"), "token-classification": ("user", "USER_TASKS"),
          "question-answering": ("user", "USER_TASKS"),
          "sst2": ("glue", "GLUE_TASKS"), "mrpc": ("glue", "GLUE_TASKS"), "rte": ("glue", "GLUE_TASKS"),
          "cola": ("glue", "GLUE_TASKS"), "stsb": ("glue", "GLUE_TASKS"), "conll2003": ("ner", "CONLL2003"),
          "squad": ("qa", "SQUAD")}
TASK_NAMES = tuple(_WHERE)


def get_task(name: str) -> Task:
    if name not in _WHERE:
        raise ValueError(f"unknown task {name!r}; choose one of {', '.join(TASK_NAMES)}")
    module, attr = _WHERE[name]
    found = getattr(importlib.import_module(f"{__package__}.{module}"), attr)
    return found[name] if isinstance(found, dict) else found
