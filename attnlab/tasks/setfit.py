"""SetFit's contrastive stage (Tunstall et al. 2022, "Efficient Few-Shot Learning Without Prompts", §3):
before a sentence classifier is trained on a few hundred labels, fine-tune its encoder on *pairs* of the
labeled sentences - same label: cosine similarity of their mean-pooled vectors pushed to 1, different
labels: to 0 (sentence-transformers' CosineSimilarityLoss) - so that the sentence vectors cluster by
class. n labeled sentences give ~n^2 pairs, far more training signal than n labels; the head is then a
logistic regression on the tuned vectors (`probe.probe_init`), and finetune may train everything after.

`sample_pairs` draws the pairs (seeded, half positive, half negative, every sentence an anchor in turn,
as SetFit's own sampler), `contrastive_stage` trains the backbone on them, `pair_loss` scores a model on
a set of pairs (what the stage lowers). `pairing="all"` is the cheaper variant: each step encodes a batch
of sentences once and scores every pair inside it (16 sentences: 120 pairs per forward pass, where SetFit's
sampler spends 32 sentence encodings on 16 pairs).
"""
from __future__ import annotations

import random
from typing import Sequence

import torch
import torch.nn.functional as F

from ..heads import mean_pool
from .common import collate

# SetFit's defaults (setfit.TrainingArguments): body lr 2e-5, batches of 16 pairs, 10% warmup
SETFIT_LR = 2e-5
SETFIT_BATCH = 16
PAIRINGS = ("sampled", "all")  # SetFit's sampled pairs, or every pair within a batch of sentences


def sample_pairs(labels: Sequence[int], n_pairs: int, seed: int = 0) -> list[tuple[int, int, float]]:
    """`n_pairs` (i, j, target) index pairs of `labels`: target 1.0 for the same label, 0.0 for different,
    alternating positive / negative (so balanced to within one pair). Anchors go through a seeded shuffle of
    all sentences, round after round; each anchor's partner is drawn at random from its class (itself
    excluded) or from the other classes."""
    by_label: dict[int, list[int]] = {}
    for i, y in enumerate(labels):
        by_label.setdefault(int(y), []).append(i)
    if len(by_label) < 2:
        raise ValueError(f"SetFit pairs need at least two labels; the training examples have {len(by_label)}")
    if max(len(v) for v in by_label.values()) < 2:
        raise ValueError("SetFit pairs need a label with at least two training examples")
    rng = random.Random(seed)
    anchors: list[int] = []
    pairs: list[tuple[int, int, float]] = []
    while len(pairs) < n_pairs:
        if not anchors:
            anchors = list(range(len(labels)))
            rng.shuffle(anchors)
        i = anchors.pop()
        same = [j for j in by_label[int(labels[i])] if j != i]
        if len(pairs) % 2 == 0:      # a positive pair (an anchor alone in its class waits for a negative turn)
            if not same:
                continue
            pairs.append((i, rng.choice(same), 1.0))
        else:
            other = rng.choice([y for y in by_label if y != int(labels[i])])
            pairs.append((i, rng.choice(by_label[other]), 0.0))
    return pairs


def _pair_cosines(backbone, features: Sequence[dict], pairs: Sequence[tuple[int, int, float]],
                  pad_id: int) -> torch.Tensor:
    """Cosine similarity of the mean-pooled last hidden states of each pair's two sentences, both sides in
    one forward pass."""
    device = next(backbone.parameters()).device
    batch = collate([features[i] for i, _, _ in pairs] + [features[j] for _, j, _ in pairs], pad_id)
    mask = batch["attention_mask"].to(device)
    out = backbone(input_ids=batch["input_ids"].to(device), attention_mask=mask,
                   token_type_ids=batch["token_type_ids"].to(device))
    vectors = mean_pool(out.last_hidden_state, mask).float()
    return F.cosine_similarity(vectors[:len(pairs)], vectors[len(pairs):], dim=-1)


def _targets(pairs: Sequence[tuple[int, int, float]], device) -> torch.Tensor:
    return torch.tensor([t for _, _, t in pairs], dtype=torch.float, device=device)


@torch.no_grad()
def pair_loss(net, features: Sequence[dict], pairs: Sequence[tuple[int, int, float]], pad_id: int,
              batch_size: int = 64) -> float:
    """Mean squared error of the pairs' cosine similarities against their targets, dropout off."""
    was_training = net.training
    net.eval()
    total = 0.0
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start:start + batch_size]
        cos = _pair_cosines(net.backbone, features, chunk, pad_id)
        total += F.mse_loss(cos, _targets(chunk, cos.device), reduction="sum").item()
    net.train(was_training)
    return total / max(1, len(pairs))


def all_pair_batches(n: int, steps: int, batch_size: int, seed: int = 0) -> list[list[int]]:
    """`steps` batches of sentence indices: seeded shuffles of range(n), epoch after epoch, cut into
    batches of `batch_size` (an epoch's short tail is dropped: a batch of one has no pair)."""
    rng, batches = random.Random(seed), []
    while len(batches) < steps:
        order = list(range(n))
        rng.shuffle(order)
        cut = [order[i:i + batch_size] for i in range(0, n, batch_size)]
        batches += [b for b in cut if len(b) == batch_size] or [order]
    return batches[:steps]


def _all_pair_loss(backbone, features: Sequence[dict], batch: Sequence[int], pad_id: int) -> torch.Tensor:
    """MSE of every pair's cosine (i < j) in one batch of sentences against same-label-or-not."""
    device = next(backbone.parameters()).device
    enc = collate([features[i] for i in batch], pad_id)
    mask = enc["attention_mask"].to(device)
    out = backbone(input_ids=enc["input_ids"].to(device), attention_mask=mask,
                   token_type_ids=enc["token_type_ids"].to(device))
    vectors = F.normalize(mean_pool(out.last_hidden_state, mask).float(), dim=-1)
    labels = torch.tensor([int(features[i]["labels"]) for i in batch], device=device)
    i, j = torch.triu_indices(len(batch), len(batch), offset=1, device=device)
    cos = (vectors[i] * vectors[j]).sum(-1)
    return F.mse_loss(cos, (labels[i] == labels[j]).float())


def contrastive_stage(net, features: Sequence[dict], pad_id: int, steps: int, *, lr: float = SETFIT_LR,
                      batch_size: int = SETFIT_BATCH, warmup_ratio: float = 0.1, weight_decay: float = 0.01,
                      seed: int = 0, pairing: str = "sampled", precision: str = "fp32") -> list[float]:
    """Train `net.backbone` in place for `steps` AdamW steps on `steps * batch_size` pairs of `features`
    (each with an int `labels`), or with pairing="all" on every pair within `steps` batches of
    `batch_size` sentences; parameters with requires_grad off (e.g. frozen word embeddings) stay as
    they are. Linear warmup and decay, gradients clipped to norm 1. `precision` as the Trainer's
    ("fp32", "bf16": forward passes under bf16 autocast, weights kept in fp32; "auto"). Returns the loss
    of each step."""
    from ..nn.precision import autocast, resolve_precision
    from ..training.optim import build_optimizer
    if pairing not in PAIRINGS:
        raise ValueError(f"SetFit pairing={pairing!r}: choose one of {', '.join(PAIRINGS)}")
    labels = [f["labels"] for f in features]
    if len(set(int(y) for y in labels)) < 2:
        raise ValueError(f"SetFit pairs need at least two labels; the training examples have {len(set(labels))}")
    pairs = sample_pairs(labels, steps * batch_size, seed) if pairing == "sampled" else None
    groups = all_pair_batches(len(features), steps, batch_size, seed) if pairing == "all" else None
    backbone = net.backbone
    device = next(backbone.parameters()).device
    precision = resolve_precision(precision, device.type)  # once, not at every step
    optimizer, scheduler = build_optimizer(backbone, lr=lr, weight_decay=weight_decay,
                                           warmup_steps=int(steps * warmup_ratio), max_steps=steps)
    trainable = [p for p in backbone.parameters() if p.requires_grad]
    was_training = net.training
    net.train()
    torch.manual_seed(seed)  # dropout masks
    losses = []
    for step in range(steps):
        with autocast(precision, device.type):
            if groups is not None:
                loss = _all_pair_loss(backbone, features, groups[step], pad_id)
            else:
                chunk = pairs[step * batch_size:(step + 1) * batch_size]
                cos = _pair_cosines(backbone, features, chunk, pad_id)
                loss = F.mse_loss(cos, _targets(chunk, cos.device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    net.train(was_training)
    return losses
