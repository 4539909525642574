"""Names the parsers offer as choices, written here so that `attnlab COMMAND --help` imports no torch: the
modules that define them (attnlab.tasks, attnlab.objectives.distill) import it. tests/test_cli_help.py
holds each tuple equal to its source, so a task or style added there fails that test until it is added here."""
from __future__ import annotations

# attnlab.tasks.TASK_NAMES: the generic tasks (the user's own files), then the benchmark presets of them
TASKS = ("text-classification", "sentence-pair-classification", "regression", "token-classification",
         "question-answering", "sst2", "mrpc", "rte", "cola", "stsb", "conll2003", "squad")
# sorted(attnlab.objectives.distill.STYLES)
DISTILL_STYLES = ("distilbert", "minilm", "tinybert")
