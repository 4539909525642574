"""Sentence-pair examples for next-sentence prediction (BERT §3.1, Task #2) and sentence-order
prediction (ALBERT, Lan et al. 2020 §4.2), following the pair construction of google-research/bert's
create_pretraining_data.py:

* aim for `max_len - 3` tokens (room for [CLS] A [SEP] B [SEP]); with probability `short_seq_prob`
  (0.1) aim for a random shorter length in [2, max_len - 3], so the model also sees short inputs;
* gather whole sentences of a document into a chunk until the target is reached, and cut the chunk at
  a random sentence boundary into segment A and segment B;
* NSP: B is the true continuation (label 0, IsNext) or, half the time, a span of a random *other*
  document (label 1, NotNext); the sentences that B would have used are put back for the next chunk;
* SOP: B is always the true continuation; half the time A and B are swapped (label 1);
* while the pair is too long, drop a token from the longer segment, from its front or back at random.

    >>> doc = [[5, 6], [7, 8, 9], [10]]       # one document, three sentences of token ids
    instances from it look like {"input_ids": [CLS, 5, 6, SEP, 7, 8, 9, 10, SEP],
                                 "token_type_ids": [0, 0, 0, 0, 1, 1, 1, 1, 1], "next_sentence_label": 0}
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from ..data.shards import Shard


def _truncate_pair(a: list[int], b: list[int], max_tokens: int, rng: np.random.Generator) -> None:
    while len(a) + len(b) > max_tokens:
        longer = a if len(a) > len(b) else b
        # from the front or the back at random, so the model never learns where text was cut
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


def _pair(a: list[int], b: list[int], label: int, cls_id: int, sep_id: int) -> dict:
    return {"input_ids": [cls_id, *a, sep_id, *b, sep_id],
            "token_type_ids": [0] * (len(a) + 2) + [1] * (len(b) + 1), "next_sentence_label": label}


def document_pairs(documents: list[list[np.ndarray]], d: int, max_len: int, rng: np.random.Generator, *,
                   cls_id: int, sep_id: int, task: str = "nsp", short_seq_prob: float = 0.1) -> Iterator[dict]:
    """Pair examples from document `documents[d]` (a list of sentence id arrays)."""
    document = documents[d]
    max_tokens = max_len - 3
    target = max_tokens if rng.random() >= short_seq_prob else int(rng.integers(2, max_tokens + 1))
    chunk: list[np.ndarray] = []
    length, i = 0, 0
    while i < len(document):
        chunk.append(document[i])
        length += len(document[i])
        if i == len(document) - 1 or length >= target:
            a_end = int(rng.integers(1, len(chunk))) if len(chunk) >= 2 else 1
            a = [int(x) for s in chunk[:a_end] for x in s]
            b = [int(x) for s in chunk[a_end:] for x in s]
            label = 0
            if task == "nsp" and (len(chunk) == 1 or rng.random() < 0.5) and len(documents) > 1:
                label, b = 1, []
                other = d
                while other == d:
                    other = int(rng.integers(0, len(documents)))
                rdoc = documents[other]
                for s in rdoc[int(rng.integers(0, len(rdoc))):]:
                    b.extend(int(x) for x in s)
                    if len(b) >= target - len(a):
                        break
                i -= len(chunk) - a_end  # the unused sentences start the next chunk
            elif task == "sop":
                if not b and len(a) >= 2:  # a one-sentence chunk: split the sentence itself
                    cut = int(rng.integers(1, len(a)))
                    a, b = a[:cut], a[cut:]
                if rng.random() < 0.5:
                    label, a, b = 1, b, a
            _truncate_pair(a, b, max_tokens, rng)
            if a and b:
                yield _pair(a, b, label, cls_id, sep_id)
            chunk, length = [], 0
            target = max_tokens if rng.random() >= short_seq_prob else int(rng.integers(2, max_tokens + 1))
        i += 1


def pair_examples(shards: list[Shard], max_len: int, cls_id: int, sep_id: int, rng: np.random.Generator, *,
                  task: str = "nsp", short_seq_prob: float = 0.1, min_pool_documents: int = 16) -> Iterator[dict]:
    """One epoch of pair examples over `shards`, shuffled within a pool. A pool is one shard, or several
    small ones (a held-out split) until it holds `min_pool_documents`: the random "other document" for
    NotNext comes from the same pool, and only one pool is in memory at a time."""
    if task not in ("nsp", "sop"):
        raise ValueError(f"task={task!r}: expected 'nsp' or 'sop'")
    pool: list[list[np.ndarray]] = []
    order = rng.permutation(len(shards))
    for n, s in enumerate(order):
        shard = shards[s]
        pool += [shard.document(d) for d in range(shard.num_documents)]
        if len(pool) < min_pool_documents and n < len(order) - 1:
            continue
        examples = [e for d in range(len(pool))
                    for e in document_pairs(pool, d, max_len, rng, cls_id=cls_id, sep_id=sep_id,
                                            task=task, short_seq_prob=short_seq_prob)]
        pool = []
        for k in rng.permutation(len(examples)):
            yield examples[k]
