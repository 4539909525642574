"""Self-training on spans of the labeled sentences: more training examples from the training file
alone. A first fine-tune (the teacher) labels random contiguous spans of the training sentences; the spans it
labels confidently join the gold sentences, and a fresh copy of the pretrained model (the student) fine-tunes
on both. No other text is read: it needs no unlabeled data.

The idea, where crops labeled like their whole sentence lost (research/fewlabel/RESULTS.md): a
span of a review often carries another sentiment than the whole ("not bad" holds "bad"); the teacher
labels the span for what it says, as SST's annotators labeled phrases, and the spans it is unsure of are left
out. It is self-training (Scudder 1965; Xie et al. 2020's noisy student) with the unlabeled data made from the
labeled sentences, and SST's own observation (Socher et al. 2013) that labeled phrases teach composition.

Measured on SST-2 with all-MiniLM-L6-v2 at 1,000 labeled sentences (3 draws x 3 seeds; research/fewlabel/
RESULTS.md): no gain over the plain fine-tune, for 2.7 times its CPU, so it is an option
(`finetune --self-train K`), not a default.

`random_spans` draws the spans (seeded), `confident_labels` keeps the teacher's confident ones.
"""
from __future__ import annotations

import random
from typing import Sequence

import torch

from .common import run_model

SPANS_PER_SENTENCE = 5   # spans drawn from each training sentence (duplicates and whole sentences dropped)
SPAN_SHARE = (0.3, 0.9)  # a span keeps this share of the sentence's words (uniform), at least 2 words
MIN_WORDS = 4            # shorter sentences give no spans
CONFIDENCE = 0.9         # a span joins the training data when the teacher's top class has at least this probability


def random_spans(texts: Sequence[str], per_sentence: int = SPANS_PER_SENTENCE, seed: int = 0,
                 share: tuple[float, float] = SPAN_SHARE, min_words: int = MIN_WORDS) -> list[str]:
    """Distinct contiguous word spans of `texts` (per_sentence draws from each text of at least `min_words`
    words, each keeping a uniform `share` of its words, at least 2), none equal to a whole text; sorted."""
    if per_sentence < 0:
        raise ValueError(f"self-training: {per_sentence} spans per sentence; give 0 (off) or more")
    lo, hi = share
    if not 0 < lo <= hi < 1:
        raise ValueError(f"self-training: span share {share} must satisfy 0 < low <= high < 1")
    rng = random.Random(seed)
    wholes = {" ".join(t.split()) for t in texts}
    spans: set[str] = set()
    for text in texts:
        words = text.split()
        if len(words) < min_words:
            continue
        for _ in range(per_sentence):
            n = max(2, round(len(words) * rng.uniform(lo, hi)))
            start = rng.randrange(0, len(words) - n + 1)
            spans.add(" ".join(words[start:start + n]))
    return sorted(spans - wholes)


def confident_labels(model, features: Sequence[dict], pad_id: int, labels: Sequence,
                     threshold: float = CONFIDENCE) -> list[tuple[int, object, float]]:
    """(index, label, probability) of each feature whose most probable class under `model` (a sequence
    classifier) has at least `threshold` probability; `labels[i]` names class i."""
    if not 0 < threshold <= 1:
        raise ValueError(f"self-training: confidence threshold {threshold} must be in (0, 1]")
    if not features:
        return []
    with torch.no_grad():
        probs = torch.stack(run_model(model, features, pad_id)).softmax(-1)
    top, cls = probs.max(-1)
    return [(i, labels[c], p) for i, (p, c) in enumerate(zip(top.tolist(), cls.tolist())) if p >= threshold]
