"""What every fine-tuning task shares: the data error type, length-bucketed batching with padding only
to the longest in a batch, running a model over features, and the metrics (written out, not imported,
so each is a few readable lines; tests hold them equal to scikit-learn / scipy).

A *feature* is one model input as a dict of plain lists: `input_ids`, `token_type_ids`, and per task
`labels` (int, float, or a per-token list) or `start_positions`/`end_positions`, plus bookkeeping keys
(`example`) that collation leaves out.
"""
from __future__ import annotations

import math
import random
from typing import Callable, Iterator, Sequence

import torch

MODEL_KEYS = ("input_ids", "token_type_ids", "labels", "start_positions", "end_positions")


class DataError(ValueError):
    """Input data that cannot be used; the message names the file, the line and what is wrong."""


# ----------------------------------------------------------------------------------- batching
def length_batches(lengths: Sequence[int], batch_size: int, *, shuffle: bool, seed: int = 0,
                   pool: int = 50) -> list[list[int]]:
    """Batches of indices that hold inputs of similar length, so padding (wasted compute) stays small.

    Training (`shuffle=True`): shuffle, cut into pools of `pool` batches, sort each pool by length, cut it
    into batches, then shuffle the batch order; examples still meet in a random order each epoch while a
    batch's lengths are close. Evaluation: simply sorted by length (callers restore the order).
    """
    order = list(range(len(lengths)))
    if not shuffle:
        order.sort(key=lambda i: lengths[i])
        return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    rng = random.Random(seed)
    rng.shuffle(order)
    batches = []
    step = batch_size * pool
    for start in range(0, len(order), step):
        chunk = sorted(order[start:start + step], key=lambda i: lengths[i])
        batches += [chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    return batches


class EpochBatches:
    """Training batches for the Trainer, reshuffled every epoch: `plan(epoch)` gives that epoch's batches
    of example indices (length-bucketed, shuffled with a seed derived from the epoch), `make(indices)`
    builds one batch. Iterating yields the rest of the current epoch; `state_dict` is the position, so a
    resumed run continues with the very batch it would have taken next."""

    def __init__(self, plan: Callable[[int], list[list[int]]], make: Callable[[list[int]], dict]) -> None:
        self.plan, self.make = plan, make
        self.epoch, self.position = 0, 0
        self._len = len(plan(0))

    def __len__(self) -> int:
        return self._len

    def __iter__(self):
        batches = self.plan(self.epoch)
        if self.position >= len(batches):  # resumed from a checkpoint taken just after an epoch's last batch
            self.epoch, self.position = self.epoch + 1, 0
            batches = self.plan(self.epoch)
        while self.position < len(batches):
            idx = batches[self.position]
            self.position += 1
            yield self.make(idx)
        self.epoch, self.position = self.epoch + 1, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


def collate(features: Sequence[dict], pad_id: int, multiple: int = 1) -> dict[str, torch.Tensor]:
    """Pad to the longest input of this batch (rounded up to a `multiple` of tokens: a compiled step then
    sees a few shapes, not one per length): ids with pad_id, per-token labels with -100 (ignored)."""
    width = max(len(f["input_ids"]) for f in features)
    width = -(-width // multiple) * multiple
    batch: dict[str, torch.Tensor] = {}
    ids = torch.full((len(features), width), pad_id, dtype=torch.long)
    types = torch.zeros((len(features), width), dtype=torch.long)
    mask = torch.zeros((len(features), width), dtype=torch.long)
    for row, f in enumerate(features):
        n = len(f["input_ids"])
        ids[row, :n] = torch.tensor(f["input_ids"])
        types[row, :n] = torch.tensor(f["token_type_ids"])
        mask[row, :n] = 1
    batch.update(input_ids=ids, token_type_ids=types, attention_mask=mask)
    if "labels" in features[0]:
        first = features[0]["labels"]
        if isinstance(first, list):
            labels = torch.full((len(features), width), -100, dtype=torch.long)
            for row, f in enumerate(features):
                labels[row, :len(f["labels"])] = torch.tensor(f["labels"])
        else:
            dtype = torch.float if isinstance(first, float) else torch.long
            labels = torch.tensor([f["labels"] for f in features], dtype=dtype)
        batch["labels"] = labels
    for key in ("start_positions", "end_positions"):
        if key in features[0]:
            batch[key] = torch.tensor([f[key] for f in features], dtype=torch.long)
    if "soft_labels" in features[0]:  # a teacher's logits per example (tasks/prompt_teacher.py)
        batch["soft_labels"] = torch.tensor([f["soft_labels"] for f in features], dtype=torch.float)
    return batch


@torch.no_grad()
def run_model(model, features: Sequence[dict], pad_id: int, batch_size: int = 64,
              progress: bool = False) -> list[torch.Tensor]:
    """Logits for every feature, in input order, cut to the feature's own length for per-token heads:
    (num_labels,) for sequence heads, (len, num_labels) or (len, 2) (start, end) for token/span heads."""
    from tqdm import tqdm
    was_training = model.training
    model.eval()
    # the Trainer puts the model on CUDA when there is one (a stand-in model without weights stays on the CPU)
    device = next(iter(model.parameters()), torch.empty(0)).device
    out: list[torch.Tensor | None] = [None] * len(features)
    batches = length_batches([len(f["input_ids"]) for f in features], batch_size, shuffle=False)
    for idx in tqdm(batches, desc="evaluate", disable=not progress, leave=False):
        batch = collate([features[i] for i in idx], pad_id)
        logits = model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device),
                       token_type_ids=batch["token_type_ids"].to(device)).logits.float().cpu()
        for row, i in enumerate(idx):
            out[i] = logits[row] if logits.dim() == 2 else logits[row, :len(features[i]["input_ids"])]
    model.train(was_training)
    return out  # type: ignore[return-value]


# ----------------------------------------------------------------------------------- metrics
def accuracy(pred: Sequence, gold: Sequence) -> float:
    return sum(p == g for p, g in zip(pred, gold)) / max(len(gold), 1)


def f1_binary(pred: Sequence[int], gold: Sequence[int], positive: int = 1) -> float:
    """F1 of the positive class (MRPC reports it for label 1, "paraphrase")."""
    tp = sum(p == positive and g == positive for p, g in zip(pred, gold))
    fp = sum(p == positive and g != positive for p, g in zip(pred, gold))
    fn = sum(p != positive and g == positive for p, g in zip(pred, gold))
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def matthews_corrcoef(pred: Sequence[int], gold: Sequence[int]) -> float:
    """Matthews correlation for binary labels (CoLA): (TP·TN − FP·FN) / sqrt of the four margins;
    0 when a margin is empty (a constant predictor), as scikit-learn does."""
    tp = sum(p == 1 and g == 1 for p, g in zip(pred, gold))
    tn = sum(p == 0 and g == 0 for p, g in zip(pred, gold))
    fp = sum(p == 1 and g == 0 for p, g in zip(pred, gold))
    fn = sum(p == 0 and g == 1 for p, g in zip(pred, gold))
    denom = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return (tp * tn - fp * fn) / denom if denom else 0.0


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sx = math.sqrt(sum((a - mx) ** 2 for a in x))
    sy = math.sqrt(sum((b - my) ** 2 for b in y))
    return cov / (sx * sy) if sx and sy else 0.0


def _ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks; ties share the mean of the ranks they span (as scipy.stats.rankdata)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson correlation of the ranks."""
    return pearson(_ranks(x), _ranks(y))


def iter_lines(path) -> Iterator[tuple[int, str]]:
    """(1-based line number, line without its newline); a UTF-8 BOM (GLUE MRPC has one) is dropped."""
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataError(f"{path}:{number}: not valid UTF-8 (byte {raw[err.start]:#04x} at column "
                                f"{err.start + 1})") from None
            if number == 1:
                line = line.removeprefix("\ufeff")
            yield number, line.rstrip("\r\n")
