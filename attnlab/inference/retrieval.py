"""Passage retrieval from one encoder, two ways: a single vector per text (dense, DPR-style) or one vector
per token scored by MaxSim (late interaction, ColBERT-style).

dense    (Karpukhin et al. 2020, DPR): passage and query are each the L2-normalised mean of the encoder's
         last hidden states over real tokens (as sentence-transformers pools MiniLM); score = q . p, a cosine.
colbert  (Khattab & Zaharia 2020, ColBERT §3.2-3.3): every real token keeps its own L2-normalised vector;
         score(q, p) = sum over query tokens i of max over passage tokens j of q_i . p_j (MaxSim).
         Unlike the paper there is no [Q]/[D] marker, no [MASK] query augmentation, no 128-d projection and no
         punctuation filter: both kinds read the same unchanged MiniLM, so the comparison is of scoring only.

An index is a directory, written to a temporary name and renamed (a killed build leaves no half index):
  vectors.npy   (rows, d) float32 or float16: one row per passage (dense) or per passage token (colbert)
  offsets.npy   (passages + 1,) int64: passage i owns rows offsets[i]:offsets[i + 1]
  passages.jsonl one JSON string per line, the passage text
  meta.json     kind, model, dim, dtype, max_length, counts
Search is exhaustive numpy (a matmul and, for colbert, a segmented max with `np.maximum.reduceat`): at
SQuAD-dev scale (hundreds of passages, ~10^5 token rows) it is milliseconds, so FAISS would not earn its place.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .embed import hidden_batches, pool

KINDS = ("dense", "colbert")
DTYPES = ("float32", "float16")
FILES = ("meta.json", "vectors.npy", "offsets.npy", "passages.jsonl")
FORMAT = 1


class IndexError_(ValueError):
    """An index directory that cannot be read; the message names the directory and the file."""


@dataclass
class Index:
    kind: str
    vectors: np.ndarray
    offsets: np.ndarray
    passages: list[str]
    meta: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.passages)

    def rows(self, i: int) -> np.ndarray:
        return self.vectors[self.offsets[i]:self.offsets[i + 1]]

    def float32(self) -> "Index":
        """The same index with float32 vectors (a float16 index is stored small and scored in float32)."""
        if self.vectors.dtype == np.float32:
            return self
        return Index(self.kind, self.vectors.astype(np.float32), self.offsets, self.passages, self.meta)


@torch.inference_mode()
def encode(model, tokenizer, texts: list[str], kind: str, *, max_length: int | None = None, batch_size: int = 32,
           progress: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(vectors, offsets) for `texts`: one normalised mean vector per text (dense) or every real token's
    normalised vector (colbert), float32; text i owns rows offsets[i]:offsets[i + 1]."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} is not one of {', '.join(KINDS)}")
    pieces: list[np.ndarray | None] = [None] * len(texts)
    for batch, hidden, mask in hidden_batches(model, tokenizer, texts, batch_size=batch_size, max_length=max_length,
                                              progress=progress, desc=f"encode ({kind})"):
        if kind == "dense":
            vec = torch.nn.functional.normalize(pool(hidden, mask, "mean").float(), dim=-1).cpu().numpy()
            for row, i in enumerate(batch):
                pieces[i] = vec[row:row + 1]
        else:
            tok = torch.nn.functional.normalize(hidden.float(), dim=-1).cpu().numpy()
            lengths = mask.sum(1).tolist()
            for row, i in enumerate(batch):  # right padding: a text's real tokens are its first `length`
                pieces[i] = tok[row, :lengths[row]]
    width = getattr(model, "backbone", model).config.hidden_size
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(p) for p in pieces])
    vectors = np.concatenate(pieces, 0) if texts else np.zeros((0, width), np.float32)
    return vectors.astype(np.float32, copy=False), offsets


def build_index(model, tokenizer, passages: list[str], kind: str = "dense", *, model_name: str = "",
                max_length: int | None = None, batch_size: int = 32, dtype: str = "float32",
                progress: bool | None = None) -> Index:
    if not passages:
        raise ValueError("no passages to index")
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not one of {', '.join(DTYPES)}")
    vectors, offsets = encode(model, tokenizer, passages, kind, max_length=max_length, batch_size=batch_size,
                              progress=progress)
    meta = {"format": FORMAT, "kind": kind, "model": str(model_name), "dim": int(vectors.shape[1]), "dtype": dtype,
            "max_length": max_length, "passages": len(passages), "rows": int(vectors.shape[0])}
    return Index(kind, vectors.astype(dtype), offsets, list(passages), meta)


def save_index(index: Index, directory: str | Path) -> Path:
    """Write the index into a temporary sibling directory, then rename it into place (replacing an old one)."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}.", suffix=".tmp"))
    try:
        np.save(tmp / "vectors.npy", index.vectors)
        np.save(tmp / "offsets.npy", index.offsets)
        with open(tmp / "passages.jsonl", "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(p, ensure_ascii=False) + "\n" for p in index.passages)
        (tmp / "meta.json").write_text(json.dumps(index.meta, indent=1) + "\n", encoding="utf-8")
        for name in FILES:
            with open(tmp / name, "rb") as fh:
                os.fsync(fh.fileno())
        os.chmod(tmp, 0o755)
        if directory.exists():  # out of sight first, so the old index is either whole or gone
            doomed = directory.with_name(f".{directory.name}.old-{os.getpid()}")
            os.replace(directory, doomed)
            shutil.rmtree(doomed, ignore_errors=True)
        os.replace(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


def index_bytes(directory: str | Path) -> int:
    """Bytes on disk of the index files (what the index costs to keep)."""
    return sum((Path(directory) / name).stat().st_size for name in FILES)


def load_index(directory: str | Path) -> Index:
    directory = Path(directory)
    for name in FILES:
        if not (directory / name).is_file():
            raise IndexError_(f"{directory}: not an attnlab index (no {name}; build one with `attnlab index`)")
    try:
        meta = json.loads((directory / "meta.json").read_text(encoding="utf-8"))
        vectors = np.load(directory / "vectors.npy", allow_pickle=False)
        offsets = np.load(directory / "offsets.npy", allow_pickle=False)
        with open(directory / "passages.jsonl", encoding="utf-8") as fh:
            passages = [json.loads(line) for line in fh]
    except (ValueError, OSError) as err:
        raise IndexError_(f"{directory}: unreadable index file ({err})") from None
    if not isinstance(meta, dict) or meta.get("kind") not in KINDS:
        raise IndexError_(f"{directory / 'meta.json'}: kind must be one of {', '.join(KINDS)}")
    if vectors.ndim != 2 or offsets.shape != (len(passages) + 1,) or offsets[0] != 0 \
            or offsets[-1] != len(vectors) or np.any(np.diff(offsets) <= 0):
        raise IndexError_(f"{directory}: vectors {vectors.shape}, offsets {offsets.shape} and "
                          f"{len(passages)} passages do not fit together")
    return Index(meta["kind"], vectors, offsets, passages, meta)


def maxsim(query: np.ndarray, vectors: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """ColBERT's score of one query (Lq, d) against every passage: for each query token the best cosine over
    a passage's rows, summed over query tokens. One (Lq, rows) matmul, then a max per passage segment."""
    sim = query @ vectors.T
    return np.maximum.reduceat(sim, offsets[:-1], axis=1).sum(0)


def scores(index: Index, query: np.ndarray) -> np.ndarray:
    """Score of every passage for one encoded query (dense: (1, d); colbert: (Lq, d)); `index.float32()`."""
    if index.kind == "dense":
        return index.vectors @ query[0]
    return maxsim(query, index.vectors, index.offsets)


def top_k(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest values, best first (ties: the lower index first)."""
    k = min(k, len(values))
    part = np.argpartition(-values, k - 1)[:k] if k < len(values) else np.arange(len(values))
    return part[np.lexsort((part, -values[part]))]


def search(index: Index, model, tokenizer, queries: list[str], k: int = 10, *,
           max_length: int | None = None) -> list[list[tuple[int, float]]]:
    """For each query, the k best (passage number, score) pairs, best first."""
    index = index.float32()
    results = []
    for query in queries:
        q, _ = encode(model, tokenizer, [query], index.kind, max_length=max_length, progress=False)
        s = scores(index, q)
        results.append([(int(i), float(s[i])) for i in top_k(s, k)])
    return results
