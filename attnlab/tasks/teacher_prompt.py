"""The prompt a causal-LM teacher reads for a classification task, made from the task's own label names.

    task_prompt(task, ["sports", "politics", "tech"])
    -> ("Text: {text}\\nLabel (sports, politics or tech):", {"sports": "sports", "politics": "politics", ...})

The LM is fine-tuned to put the right label word next (prompt-based fine-tuning, Schick & Schuetze 2021), so
the template only has to name the choices: the words themselves carry what the model already knows of them.
Labels that are numbers or codes (SST-2's "0" / "1") say nothing to it; a task's `label_names` maps them to
words ({"0": "negative", "1": "positive"}), and without one the teacher refuses them rather than guess.
"""
from __future__ import annotations

import re
from typing import Sequence

TEMPLATE = "Text: {text}\nLabel ({choices}):"
_WORD = re.compile(r"[^\W\d_]{2,}")   # a run of two letters or more: "positive", "not_entailment"; not "0", "B1"


def label_word(name: str) -> str:
    """The word the teacher reads for a label name: separators between words become spaces."""
    return " ".join(re.sub(r"[_\-]+", " ", name).split())


def task_prompt(task, labels: Sequence[str]) -> tuple[str, dict[str, str]]:
    """(template with "{text}", {label: word}) for a single-sentence classification `task` whose class names are
    `labels` (the ids' order). SST-2 reads it too: its former hand-written "Review: {text}\\nSentiment:" scored
    no better on held-out training sentences (research/fewlabel/PROMPTS.md)."""
    labels = [str(label) for label in labels]
    if len(labels) < 2:
        raise ValueError(f"{task.name}: the teacher needs at least two labels, got {', '.join(labels) or 'none'}")
    if len(getattr(task, "columns", (0,))) != 1:
        raise ValueError(f"{task.name}: the teacher's prompt reads one sentence; this task reads pairs")
    names = getattr(task, "label_names", None) or {}
    if names:
        unnamed = [label for label in labels if label not in names]
        if unnamed:
            raise ValueError(f"{task.name}: label(s) {', '.join(map(repr, unnamed))} are not in the task's "
                             f"label_names ({', '.join(f'{k}: {v}' for k, v in names.items())})")
    words = {label: label_word(names.get(label, label)) for label in labels}
    codes = [label for label in labels if not _WORD.search(words[label])]
    if codes:
        raise ValueError(f"{task.name}: labels {', '.join(codes)} are not words: give the task label names "
                         "(the LM teacher's prompt reads them: write the class names, such as 'negative' / "
                         "'positive', in the training file's label column)")
    seen: dict[str, str] = {}
    for label, word in words.items():
        if word.lower() in seen:
            raise ValueError(f"{task.name}: labels {seen[word.lower()]!r} and {label!r} read as the same word "
                             f"{word!r}")
        seen[word.lower()] = label
    shown = [words[label] for label in labels]
    choices = f"{', '.join(shown[:-1])} or {shown[-1]}"
    # the format braces of a label word would break the template's own {text}
    return TEMPLATE.format(choices=choices.replace("{", "{{").replace("}", "}}"), text="{text}"), words


def label_token_ids(tokenizer, words: Sequence[str], teacher: str) -> list[int]:
    """The token the teacher is scored on for each label word (after a space, as it follows the prompt's colon):
    its first one. Words of several tokens are told apart by that first token alone, so two words that start
    with the same token (" very negative", " very positive") cannot be, and are refused by name."""
    ids, first = [], {}
    for w in words:
        t = tokenizer.encode(" " + w, add_special_tokens=False)
        if not t:
            raise ValueError(f"teacher {teacher}: the label word {w!r} is no token for its tokenizer")
        if t[0] in first:
            raise ValueError(f"teacher {teacher}: the label words {first[t[0]]!r} and {w!r} start with the same "
                             f"token ({tokenizer.decode([t[0]])!r}), which the prompt classifier reads; give "
                             "the labels names that differ in their first word")
        first[t[0]] = w
        ids.append(t[0])
    return ids
