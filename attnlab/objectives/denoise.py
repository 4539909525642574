"""BART's denoising objective (Lewis et al. 2019, §2.2): corrupt a document with any composition of five
noising functions, and train the encoder-decoder to write the original back (the decoder reads
"</s> <s> x" and predicts "<s> x </s>", the cross-entropy of the reconstruction).

The five functions, on words for readability (ids in practice), each `f(ids, rng, ...) -> (noised, record)`
where `record` says what was done (what the tests check):

    original              The cat sat . It was warm .
    token_masking         The <mask> sat . It <mask> warm .     tokens replaced by <mask> (as BERT)
    token_deletion        The sat . It warm .                   tokens removed: where is now for the model to find
    text_infilling        The <mask> . It <mask> was warm .     spans of Poisson(3) length -> one <mask> each;
                                                                a 0-length span inserts a <mask> ("It <mask> was")
    sentence_permutation  It was warm . The cat sat .           sentences (split at full stops) shuffled
    document_rotation     sat . It was warm . The cat           rotated to start at a random token

`noise(ids, rng, cfg, ...)` composes them in the order of fairseq's BART: sentences permuted, the
document rotated, then the token-level functions (masking, deletion, infilling) on the result.
BART-large used text infilling of 30% of the tokens plus sentence permutation (§5.1); that is
`NoiseConfig()`. Everything is drawn from the `rng` passed in (numpy Generator): a seed fixes the noise.

How many tokens: masking and deletion take exactly round(rate * n) positions chosen uniformly.
Infilling draws budget / lambda spans (budget = round(rate * n), the count rounded at random so that
its expectation is exact) with independent Poisson(lambda) lengths: the expected number of noised
tokens is the budget and every span is a whole Poisson draw. (Drawing until the budget is reached and
cutting the last span, as fairseq does, pulls the mean span length below lambda: 2.95 on WikiText-2.)
The spans are then placed uniformly at random, apart (two spans may touch; each keeps its own <mask>).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F

IGNORE = -100
SENTENCE_ENDS = (".", "!", "?")


def _rounded(rate: float, n: int) -> int:
    return int(min(n, max(0, round(rate * n))))


def token_masking(ids: Sequence[int], rng: np.random.Generator, rate: float, mask_id: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Replace round(rate * n) tokens chosen uniformly with <mask>; record: their positions (sorted)."""
    out = np.array(ids, dtype=np.int64)
    chosen = np.sort(rng.choice(len(out), size=_rounded(rate, len(out)), replace=False))
    out[chosen] = mask_id
    return out, chosen


def token_deletion(ids: Sequence[int], rng: np.random.Generator, rate: float) -> tuple[np.ndarray, np.ndarray]:
    """Delete round(rate * n) tokens chosen uniformly; record: the deleted positions (sorted)."""
    ids = np.asarray(ids, dtype=np.int64)
    chosen = np.sort(rng.choice(len(ids), size=_rounded(rate, len(ids)), replace=False))
    keep = np.ones(len(ids), dtype=bool)
    keep[chosen] = False
    return ids[keep], chosen


def poisson_span_lengths(budget: int, rng: np.random.Generator, lam: float = 3.0, limit: int | None = None
                         ) -> list[int]:
    """Span lengths ~ Poisson(lam), budget / lam of them in expectation, so that they cover `budget`
    tokens in expectation (see the module doc); at most `limit` tokens in all (the document's length)."""
    count = budget / lam
    count = int(count) + int(rng.random() < count - int(count))  # randomized rounding: E[count] = budget / lam
    lengths = rng.poisson(lam, size=count)
    while limit is not None and lengths.sum() > limit:  # a short document cannot hold them all: shorten the longest span
        lengths[np.argmax(lengths)] -= 1
    return lengths.tolist()


def text_infilling(ids: Sequence[int], rng: np.random.Generator, rate: float, mask_id: int, lam: float = 3.0
                   ) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Replace spans of Poisson(lam) length, about rate * n tokens in all, by one <mask> each (a 0-length
    span inserts one); record: the spans as (start in `ids`, length), in order."""
    ids = np.asarray(ids, dtype=np.int64)
    n = len(ids)
    lengths = poisson_span_lengths(_rounded(rate, n), rng, lam, limit=n)
    if not lengths:
        return ids.copy(), []
    lengths = [lengths[k] for k in rng.permutation(len(lengths))]  # the order along the text: random too
    free = n - sum(lengths)
    # spans and kept tokens in a uniformly random order: choose which of free + m items are the spans
    slots = set(rng.choice(free + len(lengths), size=len(lengths), replace=False).tolist())
    out, spans, pos, k = [], [], 0, 0
    for item in range(free + len(lengths)):
        if item in slots:
            spans.append((pos, lengths[k]))
            out.append(mask_id)
            pos += lengths[k]
            k += 1
        else:
            out.append(int(ids[pos]))
            pos += 1
    return np.asarray(out, dtype=np.int64), spans


def sentence_starts(ids: Sequence[int], end_ids: Iterable[int]) -> list[int]:
    """Where each sentence begins, splitting after every full stop (any id in `end_ids`)."""
    ends = set(end_ids)
    starts = [0]
    for i, t in enumerate(ids[:-1]):
        if int(t) in ends:
            starts.append(i + 1)
    return starts


def sentence_permutation(ids: Sequence[int], rng: np.random.Generator, starts: Sequence[int]
                         ) -> tuple[np.ndarray, np.ndarray]:
    """Shuffle the sentences beginning at `starts` (from `sentence_starts` or the corpus's own
    boundaries); record: the new order (sentence indices)."""
    ids = np.asarray(ids, dtype=np.int64)
    bounds = [*sorted(set(starts) | {0}), len(ids)]
    sentences = [ids[a:b] for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
    order = rng.permutation(len(sentences))
    out = np.concatenate([sentences[k] for k in order]) if sentences else ids.copy()
    return out, order


def document_rotation(ids: Sequence[int], rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """Rotate so that the document begins at a token chosen uniformly; record: that token's position."""
    ids = np.asarray(ids, dtype=np.int64)
    start = int(rng.integers(len(ids))) if len(ids) else 0
    return np.concatenate([ids[start:], ids[:start]]), start


@dataclass
class NoiseConfig:
    """Which noising functions run, and how much. Default: BART-large's choice (§5.1), text infilling of
    30% of the tokens and sentence permutation."""
    mask: float = 0.0           # token masking: share of tokens replaced by <mask>
    delete: float = 0.0         # token deletion: share of tokens removed
    infill: float = 0.3         # text infilling: share of tokens inside masked spans
    poisson_lambda: float = 3.0  # mean span length of text infilling
    permute: float = 1.0        # probability that a document's sentences are shuffled
    rotate: float = 0.0         # probability that a document is rotated

    def validate(self) -> None:
        for name in ("mask", "delete", "infill", "permute", "rotate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"objective.noise_{name}={getattr(self, name)}: must lie in [0, 1]")
        if self.mask + self.delete + self.infill >= 1.0:
            raise ValueError(f"objective: noise_mask + noise_delete + noise_infill = "
                             f"{self.mask + self.delete + self.infill:g} leaves nothing to read; keep it below 1")
        if self.poisson_lambda <= 0:
            raise ValueError(f"objective.poisson_lambda={self.poisson_lambda}: must be positive")


def noise(ids: Sequence[int], rng: np.random.Generator, cfg: NoiseConfig, mask_id: int,
          starts: Sequence[int] | None = None, end_ids: Iterable[int] = ()) -> np.ndarray:
    """The composition of the module doc. Sentences begin at `starts`, else after each of `end_ids`."""
    out = np.asarray(ids, dtype=np.int64)
    if cfg.permute and rng.random() < cfg.permute:
        out, _ = sentence_permutation(out, rng, starts if starts is not None else sentence_starts(out, end_ids))
    if cfg.rotate and rng.random() < cfg.rotate:
        out, _ = document_rotation(out, rng)
    if cfg.mask:
        out, _ = token_masking(out, rng, cfg.mask, mask_id)
    if cfg.delete:
        out, _ = token_deletion(out, rng, cfg.delete)
    if cfg.infill:
        out, _ = text_infilling(out, rng, cfg.infill, mask_id, cfg.poisson_lambda)
    return out


def sentence_end_ids(tokenizer) -> list[int]:
    """Ids of the byte-level BPE tokens that are a full stop ("." / "Ġ." and "!", "?")."""
    return sorted(i for t, i in tokenizer.get_vocab().items() if t.lstrip("Ġ▁ ") in SENTENCE_ENDS)


# ----------------------------------------------------------------------------------- pretraining
def document_chunks(shards, seq_len: int, rng: np.random.Generator) -> Iterator[tuple[np.ndarray, list[int]]]:
    """One epoch of (ids, sentence starts): each document cut into runs of whole sentences of at most
    seq_len - 2 tokens (room for <s> and </s>; a longer sentence is cut), shards and chunks shuffled."""
    body = seq_len - 2
    for s in rng.permutation(len(shards)):
        shard, chunks = shards[s], []
        for d in range(shard.num_documents):
            ids, starts = [], []
            for sentence in shard.document(d):
                for a in range(0, len(sentence), body):
                    piece = np.asarray(sentence[a:a + body], dtype=np.int64)
                    if ids and sum(map(len, ids)) + len(piece) > body:
                        chunks.append((np.concatenate(ids), starts))
                        ids, starts = [], []
                    starts.append(sum(map(len, ids)))
                    ids.append(piece)
            if ids:
                chunks.append((np.concatenate(ids), starts))
        for k in rng.permutation(len(chunks)):
            yield chunks[k]


def denoise_collate(examples: list, rng: np.random.Generator, cfg: NoiseConfig, *, bos_id: int, eos_id: int,
                    pad_id: int, mask_id: int, max_len: int) -> dict[str, torch.Tensor]:
    """input_ids = <s> noise(x) </s> (right-padded, attention_mask), labels = <s> x </s> (-100 on padding);
    the model builds the decoder input by shifting the labels right from decoder_start_token_id."""
    sources, targets = [], []
    for ids, starts in examples:
        noised = noise(ids, rng, cfg, mask_id, starts=starts)[:max_len - 2]  # zero-length spans can lengthen it
        sources.append([bos_id, *noised.tolist(), eos_id])
        targets.append([bos_id, *np.asarray(ids).tolist(), eos_id])
    input_ids = torch.full((len(sources), max(map(len, sources))), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    labels = torch.full((len(targets), max(map(len, targets))), IGNORE, dtype=torch.long)
    for i, (src, tgt) in enumerate(zip(sources, targets)):
        input_ids[i, :len(src)] = torch.tensor(src)
        attention_mask[i, :len(src)] = 1
        labels[i, :len(tgt)] = torch.tensor(tgt)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def denoise_loss(model, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Reconstruction cross-entropy over every target token; sums for the evaluation metrics."""
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
    labels = batch["labels"]
    keep = labels != IGNORE
    with torch.no_grad():
        n = keep.sum()
        nll = F.cross_entropy(out.logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE,
                              reduction="sum")
        sums = {"loss_sum": nll, "n": n.float(), "correct": ((out.logits.argmax(-1) == labels) & keep).sum().float()}
    return out.loss, sums


def denoise_metrics(sums: dict[str, float]) -> dict[str, float]:
    n = max(sums["n"], 1)
    return {"loss": sums["loss_sum"] / n, "accuracy": sums["correct"] / n}
