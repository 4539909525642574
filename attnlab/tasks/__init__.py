"""Fine-tuning tasks on real benchmarks: GLUE (glue.py), CoNLL-2003 NER (ner.py), SQuAD-style QA (qa.py).

    from attnlab.tasks import get_task, finetune, evaluate, FinetuneOptions
    metrics = finetune("mrpc", "minilm", "out/mrpc")          # writes the model + metrics.json
    metrics = finetune("mrpc", "minilm", "out/mrpc", FinetuneOptions(epochs=1, lr=3e-5))  # or epochs=1, lr=3e-5
    evaluate("mrpc", "out/mrpc", "../shared/data/glue/MRPC/dev.tsv")
"""
from __future__ import annotations

from .base import TASK_NAMES, Task, data_root, get_task
from .common import DataError
# Bound after the submodule import so that `attnlab.tasks.finetune` is the function, not the module.
from .finetune import evaluate, finetune, predict
from .finetune_options import FinetuneOptions


__all__ = ["DataError", "FinetuneOptions", "TASK_NAMES", "Task", "data_root", "evaluate", "finetune", "get_task", "predict"]
