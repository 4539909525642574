"""Masked language modelling exactly as BERT (Devlin et al. 2019, §3.1 and Appendix A.1).

Per sequence, choose 15% (`prob`) of the non-special tokens (or of the whole words, with whole-word
masking); of the chosen ones replace 80% by [MASK], 10% by a random token and leave 10% unchanged.
The model predicts the original token at every chosen position (labels elsewhere are -100).

Worked example (prob=0.5 so that something happens in a short sentence):
    ids      [CLS] the  cat  sat  on   the  mat  [SEP]     6 candidates, [CLS]/[SEP] never chosen
    chosen          the       sat            mat            round(6 * 0.5) = 3 positions
    decision        MASK      keep           random         80% / 10% / 10% per chosen position
    inputs   [CLS] [MASK] cat sat on  the  dog  [SEP]
    labels    -100 the -100  sat -100 -100 mat  -100

The masking is redrawn for every batch from (seed, slice, batch number): dynamic masking (RoBERTa),
and a resumed run draws the very same masks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch
import torch.nn.functional as F

from ..data.shards import Shard

IGNORE = -100


@dataclass
class Vocab:
    """What masking needs to know about the vocabulary."""
    size: int
    mask_id: int
    special_ids: np.ndarray          # never chosen, never used as a random replacement
    continuation: np.ndarray | None  # bool per id: a token that continues the previous word (whole-word masking)

    @classmethod
    def from_tokenizer(cls, tokenizer, need_mask: bool = True) -> "Vocab":
        mask_id = tokenizer.mask_token_id
        if mask_id is None and need_mask:
            raise ValueError(f"tokenizer {tokenizer.name or ''}: vocab has no mask token "
                             f"({tokenizer.special_tokens.get('mask_token', '[MASK]')!r}); masked LM needs one. "
                             "Train a WordPiece tokenizer (attnlab tokenizer train --kind wordpiece) or add it")
        vocab = tokenizer.get_vocab()
        size = max(tokenizer.vocab_size, max(vocab.values()) + 1)
        specials = tokenizer.special_ids
        wordpiece = type(tokenizer.backend.model).__name__ == "WordPiece"
        cont = np.zeros(size, dtype=bool)
        for token, i in vocab.items():
            # WordPiece marks continuations with "##"; byte-level BPE marks word *starts* with "Ġ" (a space)
            cont[i] = token.startswith("##") if wordpiece else not (token.startswith("Ġ") or i in specials)
        return cls(size, mask_id if mask_id is not None else -1,
                   np.array(sorted(specials), dtype=np.int64), cont)


def mask_tokens(ids: np.ndarray, vocab: Vocab, rng: np.random.Generator, prob: float = 0.15,
                mask_frac: float = 0.8, random_frac: float = 0.1, whole_word: bool = False,
                valid: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """BERT masking of a (batch, seq) id array. Returns (inputs, labels); labels are -100 where nothing
    is predicted. `valid` (bool, same shape) excludes padding. Counts per row are exact:
    round(prob * candidates), at least 1, as in google-research/bert's create_pretraining_data."""
    if not 0 < prob < 1 or mask_frac < 0 or random_frac < 0 or mask_frac + random_frac > 1:
        raise ValueError(f"masking rates prob={prob}, mask_frac={mask_frac}, random_frac={random_frac} "
                         "must satisfy 0 < prob < 1 and mask_frac + random_frac <= 1")
    ids = np.asarray(ids)
    candidate = ~np.isin(ids, vocab.special_ids)
    if valid is not None:
        candidate &= valid
    b, t = ids.shape
    n_pick = np.maximum(1, np.round(candidate.sum(1) * prob)).astype(np.int64)
    keys = rng.random((b, t))  # random priority per position: the lowest n_pick are chosen
    if whole_word and vocab.continuation is not None:
        chosen = np.stack([_choose_words(candidate[r], vocab.continuation[ids[r]], n_pick[r], keys[r])
                           for r in range(b)])
    else:
        keys = np.where(candidate, keys, np.inf)
        rank = np.argsort(np.argsort(keys, axis=1, kind="stable"), axis=1)
        chosen = (rank < n_pick[:, None]) & candidate

    labels = np.where(chosen, ids, IGNORE)
    u = rng.random((b, t))
    to_mask = chosen & (u < mask_frac)
    to_random = chosen & (u >= mask_frac) & (u < mask_frac + random_frac)
    inputs = ids.copy()
    inputs[to_mask] = vocab.mask_id
    if to_random.any():
        pool = np.setdiff1d(np.arange(vocab.size), vocab.special_ids)
        inputs[to_random] = pool[rng.integers(0, len(pool), int(to_random.sum()))]
    return inputs, labels


def _choose_words(candidate: np.ndarray, continuation: np.ndarray, n_pick: int, keys: np.ndarray) -> np.ndarray:
    """Whole-word masking for one row: words in random order, each taken whole unless it would overshoot
    n_pick tokens (then skipped, as in BERT's create_pretraining_data); at least one word."""
    prev_candidate = np.concatenate([[False], candidate[:-1]])
    starts = candidate & (~continuation | ~prev_candidate)
    if not starts.any():
        return np.zeros_like(candidate)
    word = np.where(candidate, np.cumsum(starts) - 1, -1)
    lengths = np.bincount(word[candidate])
    chosen_words, count = [], 0
    for w in np.argsort(keys[starts], kind="stable"):
        if count + lengths[w] > n_pick:
            continue
        chosen_words.append(w)
        count += lengths[w]
        if count >= n_pick:
            break
    if not chosen_words:
        chosen_words = [int(np.argmin(keys[starts]))]
    return np.isin(word, chosen_words) & candidate


# ------------------------------------------------------------------------------------------------
# Examples: documents packed into full-length sequences, no padding

def packed_blocks(shards: list[Shard], seq_len: int, cls_id: int, sep_id: int,
                  rng: np.random.Generator) -> Iterator[np.ndarray]:
    """One epoch of [CLS] + (seq_len - 1) tokens blocks: documents concatenated with [SEP] after each,
    cut into equal blocks (RoBERTa's FULL-SENTENCES packing), shards and blocks in random order.
    Only one shard's stream is in memory at a time."""
    body = seq_len - 1
    for s in rng.permutation(len(shards)):
        shard = shards[s]
        ends = shard.sentences[shard.documents[1:]]       # token offset where each document ends
        stream = np.insert(np.asarray(shard.tokens[:shard.num_tokens], dtype=np.int64), ends, sep_id)
        n = len(stream) // body
        for k in rng.permutation(n):
            block = np.empty(seq_len, dtype=np.int64)
            block[0] = cls_id
            block[1:] = stream[k * body:(k + 1) * body]
            yield block


def mlm_collate(examples: list, vocab: Vocab, rng: np.random.Generator, prob: float = 0.15,
                whole_word: bool = False, pad_id: int = 0, sparse: bool = True) -> dict[str, torch.Tensor]:
    """Stack (packed blocks) or pad (NSP pairs: dicts with input_ids/token_type_ids/next_sentence_label)
    and mask. With sparse=True the batch carries `masked_positions`, so the MLM head runs only there."""
    if isinstance(examples[0], dict):
        length = max(len(e["input_ids"]) for e in examples)
        ids = np.full((len(examples), length), pad_id, dtype=np.int64)
        types = np.zeros_like(ids)
        valid = np.zeros(ids.shape, dtype=bool)
        for i, e in enumerate(examples):
            n = len(e["input_ids"])
            ids[i, :n], types[i, :n], valid[i, :n] = e["input_ids"], e["token_type_ids"], True
        inputs, labels = mask_tokens(ids, vocab, rng, prob, whole_word=whole_word, valid=valid)
        batch = {"input_ids": torch.from_numpy(inputs), "token_type_ids": torch.from_numpy(types),
                 "labels": torch.from_numpy(labels),
                 "next_sentence_label": torch.tensor([e["next_sentence_label"] for e in examples])}
        if not valid.all():
            batch["attention_mask"] = torch.from_numpy(valid.astype(np.int64))
    else:
        inputs, labels = mask_tokens(np.stack(examples), vocab, rng, prob, whole_word=whole_word)
        batch = {"input_ids": torch.from_numpy(inputs), "labels": torch.from_numpy(labels)}
    if sparse:
        batch["masked_positions"] = batch["labels"] != IGNORE
    return batch


def mlm_loss(model, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Cross-entropy over the predicted positions (+ NSP/SOP when the batch has next_sentence_label).
    Returns (loss, sums) where sums feed the evaluation metrics."""
    labels = batch["labels"]
    sparse = batch.get("masked_positions")
    # position_ids / langs: TLM's reset positions and language ids (objectives/tlm.py)
    inputs = {k: v for k, v in batch.items()
              if k in ("input_ids", "attention_mask", "token_type_ids", "position_ids", "langs")}
    out = model(**inputs, masked_positions=sparse) if sparse is not None else model(**inputs)
    target = labels[sparse] if sparse is not None else labels.flatten()
    logits = out.logits.reshape(-1, out.logits.size(-1)).float()
    keep = target != IGNORE
    mlm = F.cross_entropy(logits, target, ignore_index=IGNORE)
    n = keep.sum()
    with torch.no_grad():
        sums = {"mlm_loss_sum": mlm.detach() * n, "mlm_n": n.float(),
                "mlm_correct": ((logits.argmax(-1) == target) & keep).sum().float()}
    loss = mlm
    if "next_sentence_label" in batch:
        nsp_logits = out["nsp_logits"].float()
        y = batch["next_sentence_label"]
        nsp = F.cross_entropy(nsp_logits, y)
        loss = loss + nsp
        with torch.no_grad():
            sums.update(nsp_loss_sum=nsp.detach() * len(y), nsp_n=torch.tensor(float(len(y))),
                        nsp_correct=(nsp_logits.argmax(-1) == y).sum().float())
    return loss, sums


def mlm_metrics(sums: dict[str, float]) -> dict[str, float]:
    out = {"loss": sums["mlm_loss_sum"] / max(sums["mlm_n"], 1), "accuracy": sums["mlm_correct"] / max(sums["mlm_n"], 1)}
    if sums.get("nsp_n"):
        out["nsp_loss"] = sums["nsp_loss_sum"] / sums["nsp_n"]
        out["nsp_accuracy"] = sums["nsp_correct"] / sums["nsp_n"]
        out["mlm_loss"] = out["loss"]
        out["loss"] = out["mlm_loss"] + out["nsp_loss"]
    return out


def unigram_baseline(counts: np.ndarray, batches) -> dict[str, float]:
    """What word counts alone achieve on the masked positions of `batches` (each with `labels`, -100
    where nothing is predicted): `unigram_accuracy`, always guessing the most frequent training token,
    and `unigram_loss`, the cross-entropy of the add-one-smoothed unigram distribution (nats, as
    `loss`). A model's MLM accuracy is only learning beyond counting when it is above these.

    Worked example: counts [0, 0, 6, 3, 1] (ids 2-4 seen 6, 3, 1 times), targets 2, 3, 2:
        accuracy = 2/3 (id 2 is right twice); p = (c + 1) / (10 + 5) = 7/15, 4/15, 7/15
        loss = -(ln 7/15 + ln 4/15 + ln 7/15) / 3"""
    counts = np.asarray(counts, dtype=np.float64)
    logp = np.log((counts + 1) / (counts.sum() + len(counts)))
    top = int(np.argmax(counts))
    n = correct = 0
    nll = 0.0
    for batch in batches:
        labels = np.asarray(batch["labels"]).reshape(-1)
        target = labels[labels != IGNORE]
        if len(target) and int(target.max()) >= len(counts):
            raise ValueError(f"unigram_baseline: label id {int(target.max())} >= {len(counts)} counted ids")
        n += len(target)
        correct += int((target == top).sum())
        nll -= float(logp[target].sum())
    if n == 0:
        return {}
    return {"unigram_accuracy": correct / n, "unigram_loss": nll / n}
