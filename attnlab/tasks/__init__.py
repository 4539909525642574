"""Fine-tuning tasks on real benchmarks: GLUE (glue.py), CoNLL-2003 NER (ner.py), SQuAD-style QA (qa.py).

    from attnlab.tasks import get_task, finetune, evaluate
    metrics = finetune("mrpc", "minilm", "out/mrpc")          # writes the model + metrics.json
    evaluate("mrpc", "out/mrpc", "../shared/data/glue/MRPC/dev.tsv")
"""
from __future__ import annotations

from .base import Task, data_root
from .common import DataError


# task name -> (module, attribute): modules are imported on first use
_WHERE = {"sst2": ("glue", "GLUE_TASKS"), "mrpc": ("glue", "GLUE_TASKS"), "rte": ("glue", "GLUE_TASKS"),
          "cola": ("glue", "GLUE_TASKS"), "stsb": ("glue", "GLUE_TASKS"), "conll2003": ("ner", "CONLL2003"),
          "squad": ("qa", "SQUAD")}
TASK_NAMES = tuple(_WHERE)


def get_task(name: str) -> Task:
    import importlib
    if name not in _WHERE:
        raise ValueError(f"unknown task {name!r}; choose one of {', '.join(TASK_NAMES)}")
    module, attr = _WHERE[name]
    found = getattr(importlib.import_module(f"{__name__}.{module}"), attr)
    return found[name] if isinstance(found, dict) else found


# Bound after the submodule import so that `attnlab.tasks.finetune` is the function, not the module.
from .finetune import evaluate, finetune, predict  # noqa: E402


__all__ = ["DataError", "TASK_NAMES", "Task", "data_root", "evaluate", "finetune", "get_task", "predict"]
