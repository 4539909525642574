"""What a fine-tuning run learns from before training the model it keeps (its `teacher` stage, tasks/finetune.py):
the spans a first fine-tune labels (self-training), and an LM teacher's soft targets, either on augmented copies
of a few labels (below TEACHER_BELOW examples) or on every example of a full training file."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from .base import Task, labels_of
from .defaults import (FULL_TEACHER_BATCH, FULL_TEACHER_EPOCHS, FULL_TEACHER_LAYERS, FULL_TEACHER_LR,
                       FULL_TEACHER_SMOOTH, TEACHER_BELOW)
from .finetune_eval import load_for_eval


def self_training_spans(task: Task, per_sentence: int, why: str, teacher_dir: Path, teacher: dict,
                        train_ex: list[dict], max_length: int, seed: int) -> tuple[list[dict], dict]:
    """The self-training stage (tasks/selftrain.py): the spans of the training sentences that the teacher (a
    plain fine-tune of the same split, in `teacher_dir`; `teacher` its summary) labels confidently, as training
    examples, and what the summary says of them."""
    from .selftrain import CONFIDENCE, confident_labels, random_spans
    t0 = time.time()
    net, tokenizer = load_for_eval(task, teacher_dir)
    labels, label2id = labels_of(net)
    spans = random_spans([e["texts"][0] for e in train_ex], per_sentence, seed)
    feats = task.features([{"texts": [s]} for s in spans], tokenizer, max_length, label2id, training=False)
    kept = confident_labels(net, feats, tokenizer.pad_token_id, labels, CONFIDENCE)
    examples = [{"texts": [spans[i]], "label": label, "source": "self-training spans", "line": i + 1}
                for i, label, _ in kept]
    share = {label: sum(e["label"] == label for e in examples) for label in labels}
    print(f"finetune {task.name}: the teacher (step {teacher.get('best_step')}, {task.main_metric} "
          f"{teacher.get('eval_' + task.main_metric)}) labeled {len(kept)} of {len(spans)} spans with probability "
          f">= {CONFIDENCE:g} ({', '.join(f'{k}: {v}' for k, v in share.items())}; {time.time() - t0:.0f} s); "
          "the kept model is a fresh copy trained on them and the labeled examples", file=sys.stderr, flush=True)
    return examples, {"spans_per_sentence": per_sentence, "spans": len(spans), "span_examples": len(examples),
                      "confidence": CONFIDENCE, "why": why, "teacher": str(teacher_dir),
                      "teacher_best_step": teacher.get("best_step"),
                      **{f"teacher_{k}": v for k, v in teacher.items() if k.startswith("eval_")}}


def full_file(n_train: int) -> bool:
    """Whether an LM teacher runs the full-file recipe (every example, no copies) on `n_train` examples."""
    return n_train >= TEACHER_BELOW


def full_file_teacher(task: Task, train_ex: list[dict], valid_n: int, *, teacher: str, why: str, cache_dir: Path,
                      seed: int, progress: bool) -> tuple[torch.Tensor, dict]:
    """The full-file recipe's teacher: `teacher` fine-tuned as a prompt classifier on every training example
    (FULL_TEACHER_EPOCHS at FULL_TEACHER_LR in batches of FULL_TEACHER_BATCH, its bottom FULL_TEACHER_LAYERS
    layers), and its logits on them (prompt_teacher.teacher_logits), cached in `cache_dir` (a rerun into the same
    output reuses them). Returns (logits [len(train_ex), classes] in the order of task.label_list(train_ex), the
    summary's record, whose "cached" says whether they were reused)."""
    from . import prompt_teacher
    labels = task.label_list(train_ex)
    print(f"finetune {task.name}: {len(train_ex)} labeled examples train, {valid_n} validate; first an LM teacher "
          f"on every training example (the full-file recipe, {len(train_ex):,} >= {TEACHER_BELOW:,}: "
          f"{FULL_TEACHER_EPOCHS:g} epochs at lr {FULL_TEACHER_LR:g}, bottom {FULL_TEACHER_LAYERS} layers), "
          f"because {why}", file=sys.stderr, flush=True)
    logits, info = prompt_teacher.teacher_logits(task, train_ex, labels, teacher=teacher, cache_dir=cache_dir,
                                                 seed=seed, epochs=FULL_TEACHER_EPOCHS, lr=FULL_TEACHER_LR,
                                                 keep_layers=FULL_TEACHER_LAYERS, progress=progress,
                                                 batch_size=FULL_TEACHER_BATCH, smoothing=FULL_TEACHER_SMOOTH)
    if tuple(logits.shape) != (len(train_ex), len(labels)):
        raise ValueError(f"finetune {task.name}: the teacher's logits in {info.get('path', cache_dir)} have shape "
                         f"{tuple(logits.shape)}, expected ({len(train_ex)}, {len(labels)}) (examples, classes "
                         f"{', '.join(labels)})")
    where = info.get("path", str(cache_dir))
    print(f"finetune {task.name}: " + (f"reused the teacher's cached logits from {where}" if info.get("cached") else
                                       f"the teacher's logits computed in {info.get('seconds', 0):.0f} s, cached in "
                                       f"{where}"), file=sys.stderr, flush=True)
    record = {"teacher": teacher, "recipe": "full file", "epochs": FULL_TEACHER_EPOCHS, "lr": FULL_TEACHER_LR,
              "batch_size": FULL_TEACHER_BATCH, "keep_layers": FULL_TEACHER_LAYERS, "labeled_examples": len(train_ex),
              **info, "cached": bool(info.get("cached")), "why": why}
    return logits.float(), record

