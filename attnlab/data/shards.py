"""Token shards: the on-disk corpus that pretraining reads, written by `prepare_corpus`.

Layout of an output directory (shard i has one file set per split, `train` and `heldout`):

    meta.json                   tokenizer facts, dtype, totals (written last, when everything is done)
    tokenizer/                  a copy of the tokenizer, so training needs nothing else
    train-00000.tokens          token ids, uint16 when the vocab fits, else uint32 (np.memmap)
    train-00000.sentences.npy   int64 offsets: sentence j is tokens[s[j]:s[j+1]]
    train-00000.documents.npy   int64 sentence indices: document d is sentences[D[d]:D[d+1]]
    heldout-00000.*             the same for the held-out documents met while writing shard 0
    shard-00000.json            written after both splits of shard i: marks it finished and records
                                where reading stopped, so a re-run resumes after the last finished shard

Every file is written under a temporary name and renamed, so an interrupted run leaves no half shard.
Held-out documents are chosen deterministically: document k is held out when floor((k+1)f) > floor(kf)
(every 1/f-th document), or, with heldout_mode="tail", the last fraction f of every document's sentences
(nanoGPT's "last 10% of the text" for a single-document corpus).
"""
from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from ..atomic import atomic_write_json
from .corpus import CorpusReader, Document, Position

SPLITS = ("train", "heldout")
ENCODE_BATCH = 2048  # sentences per call into the Rust tokenizer (it parallelises inside a call)


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


class _SplitWriter:
    """Accumulates one split of one shard; tokens are appended to a temp file as they come."""

    def __init__(self, directory: Path, split: str, shard: int, dtype: np.dtype) -> None:
        self.stem = directory / f"{split}-{shard:05d}"
        self.tmp = self.stem.with_name(f".{self.stem.name}.tokens.tmp")
        self.fh = open(self.tmp, "wb")
        self.dtype = dtype
        self.sentence_offsets = [0]
        self.document_starts = [0]

    def add(self, sentences: list[list[int]]) -> int:
        """Append one document; returns the number of tokens written."""
        kept = [s for s in sentences if s]
        if not kept:
            return 0
        for ids in kept:
            self.sentence_offsets.append(self.sentence_offsets[-1] + len(ids))
        self.fh.write(np.concatenate([np.asarray(s, dtype=self.dtype) for s in kept]).tobytes())
        self.document_starts.append(len(self.sentence_offsets) - 1)
        return sum(map(len, kept))

    @property
    def num_tokens(self) -> int:
        return self.sentence_offsets[-1]

    def close(self) -> dict:
        self.fh.close()
        for suffix, values in ((".sentences.npy", self.sentence_offsets), (".documents.npy", self.document_starts)):
            final = self.stem.with_name(self.stem.name + suffix)
            tmp = final.with_name(f".{final.name}.tmp.npy")
            np.save(tmp, np.asarray(values, dtype=np.int64))
            os.replace(tmp, final)
        os.replace(self.tmp, self.stem.with_name(self.stem.name + ".tokens"))
        return {"tokens": self.num_tokens, "sentences": len(self.sentence_offsets) - 1,
                "documents": len(self.document_starts) - 1}


@dataclass
class PrepareStats:
    shards: int = 0
    documents: int = 0
    train_tokens: int = 0
    heldout_tokens: int = 0
    skipped_lines: int = 0
    reused_shards: int = 0


def _encode(tokenizer, sentences: list[str]) -> list[list[int]]:
    out = []
    for i in range(0, len(sentences), ENCODE_BATCH):
        out += [e.ids for e in tokenizer.backend.encode_batch(sentences[i:i + ENCODE_BATCH],
                                                              add_special_tokens=False)]
    return out


def _heldout_doc(k: int, fraction: float) -> bool:
    return fraction > 0 and math.floor((k + 1) * fraction) > math.floor(k * fraction)


def prepare_corpus(tokenizer, files: Iterable[str | Path], output: str | Path, *, documents: str = "auto",
                   raw: bool = False, heldout: float = 0.01, heldout_mode: str = "documents",
                   shard_tokens: int = 1_000_000, on_bad_utf8: str = "skip", progress: bool = True,
                   tokenizer_source: str = "") -> PrepareStats:
    """Tokenize `files` into shards under `output` (see the module doc). Re-running with the same
    arguments skips the shards already finished and continues after them."""
    from tqdm import tqdm
    files = [Path(f) for f in files]
    if not files:
        raise ValueError("no input files given")
    if not 0 <= heldout < 1:
        raise ValueError(f"heldout={heldout}: must be a fraction in [0, 1)")
    if heldout_mode not in ("documents", "tail"):
        raise ValueError(f"heldout_mode={heldout_mode!r}: expected 'documents' or 'tail'")
    if shard_tokens < 1:
        raise ValueError(f"shard_tokens={shard_tokens}: must be positive")
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    reader = CorpusReader(files, documents=documents, raw=raw, on_bad_utf8=on_bad_utf8)
    dtype = token_dtype(tokenizer.vocab_size)
    settings = {"files": [str(f) for f in files], "documents": documents, "raw": raw, "heldout": heldout,
                "heldout_mode": heldout_mode, "shard_tokens": shard_tokens, "dtype": dtype.name,
                "vocab_size": tokenizer.vocab_size}

    # Resume: the finished shards are those with a shard-*.json; continue where the last one stopped.
    stats, start, doc_index = PrepareStats(), Position(), 0
    done = sorted(output.glob("shard-*.json"))
    if done:
        old = json.loads((output / "prepare.json").read_text()) if (output / "prepare.json").exists() else {}
        if old != settings:
            raise ValueError(f"{output} holds shards prepared with other settings ({output / 'prepare.json'}); "
                             "use a new --output directory or delete the old shards")
        last = json.loads(done[-1].read_text())
        start, doc_index = Position(**last["end"]), last["documents_seen"]
        stats.shards = stats.reused_shards = len(done)
        for path in done:
            info = json.loads(path.read_text())
            stats.train_tokens += info["train"]["tokens"]
            stats.heldout_tokens += info["heldout"]["tokens"]
        stats.documents = doc_index
    atomic_write_json(output / "prepare.json", settings, indent=2)
    tokenizer.save(output / "tokenizer")

    total_bytes = sum(f.stat().st_size for f in files)
    done_bytes = sum(f.stat().st_size for f in files[:start.file_index]) + start.byte_offset
    bar = tqdm(total=total_bytes, initial=done_bytes, unit="B", unit_scale=True, desc="prepare",
               disable=not progress, file=sys.stderr)
    writers = None

    def open_shard() -> dict[str, _SplitWriter]:
        return {s: _SplitWriter(output, s, stats.shards, dtype) for s in SPLITS}

    def close_shard(end: Position) -> None:
        info = {s: w.close() for s, w in writers.items()}
        info.update(end=asdict(end), documents_seen=doc_index)
        atomic_write_json(output / f"shard-{stats.shards:05d}.json", info, indent=2)
        stats.shards += 1

    last_end = start
    for doc in reader.read(start):
        writers = writers or open_shard()
        ids = _encode(tokenizer, doc.sentences)
        if heldout_mode == "tail":
            cut = len(ids) - int(round(len(ids) * heldout))
            stats.train_tokens += writers["train"].add(ids[:cut])
            stats.heldout_tokens += writers["heldout"].add(ids[cut:])
        else:
            split = "heldout" if _heldout_doc(doc_index, heldout) else "train"
            n = writers[split].add(ids)
            stats.train_tokens += n if split == "train" else 0
            stats.heldout_tokens += n if split == "heldout" else 0
        doc_index += 1
        stats.documents = doc_index
        bar.update(_offset(files, doc.end) - _offset(files, last_end))
        last_end = doc.end
        if writers["train"].num_tokens + writers["heldout"].num_tokens >= shard_tokens:
            close_shard(doc.end)
            writers = None
    if writers is not None:
        close_shard(Position(len(files), 0, None))
    bar.close()
    stats.skipped_lines = reader.skipped_lines

    if stats.train_tokens == 0:
        empty = f" (empty files: {', '.join(reader.empty_files)})" if reader.empty_files else ""
        raise ValueError(f"no text found in {len(files)} input file(s){empty}; nothing to train on")
    meta = {"format": "attnlab-shards-1", "dtype": dtype.name, "vocab_size": tokenizer.vocab_size,
            "tokenizer": tokenizer_source or tokenizer.name, "shards": stats.shards,
            "special_ids": {role: tokenizer.backend.token_to_id(tok) for role, tok in tokenizer.special_tokens.items()
                            if tokenizer.backend.token_to_id(tok) is not None},
            **asdict(stats)}
    atomic_write_json(output / "meta.json", meta, indent=2)
    return stats


def _offset(files: list[Path], pos: Position) -> int:
    return sum(f.stat().st_size for f in files[:pos.file_index]) + pos.byte_offset


# ------------------------------------------------------------------------------------------------
# Reading

@dataclass
class Shard:
    """One split of one shard, memory-mapped: `tokens`, `sentences` offsets, `documents` starts."""
    path: Path
    tokens: np.ndarray
    sentences: np.ndarray
    documents: np.ndarray

    @property
    def num_tokens(self) -> int:
        return int(self.sentences[-1])

    @property
    def num_documents(self) -> int:
        return len(self.documents) - 1

    def document(self, d: int) -> list[np.ndarray]:
        """Document d as a list of sentence id arrays (views into the memmap)."""
        s0, s1 = self.documents[d], self.documents[d + 1]
        return [self.tokens[self.sentences[j]:self.sentences[j + 1]] for j in range(s0, s1)]

    def document_tokens(self, d: int) -> np.ndarray:
        s0, s1 = self.documents[d], self.documents[d + 1]
        return self.tokens[self.sentences[s0]:self.sentences[s1]]


def open_shards(directory: str | Path, split: str = "train") -> list[Shard]:
    """The finished shards of a prepared corpus (empty ones, e.g. a held-out part with no document, left out)."""
    directory = Path(directory)
    meta_path = directory / "meta.json"
    if not meta_path.exists():
        raise FileNotFoundError(f"{directory}: no meta.json; prepare the corpus first "
                                f"(attnlab prepare --tokenizer DIR --output {directory} FILES...)")
    meta = json.loads(meta_path.read_text())
    out = []
    for i in range(meta["shards"]):
        stem = directory / f"{split}-{i:05d}"
        sentences = np.load(stem.with_name(stem.name + ".sentences.npy"))
        if sentences[-1] == 0:
            continue
        tokens = np.memmap(stem.with_name(stem.name + ".tokens"), dtype=np.dtype(meta["dtype"]), mode="r")
        out.append(Shard(stem, tokens, sentences, np.load(stem.with_name(stem.name + ".documents.npy"))))
    return out


def read_meta(directory: str | Path) -> dict:
    return json.loads((Path(directory) / "meta.json").read_text())


def token_counts(shards: list[Shard], vocab_size: int) -> np.ndarray:
    """How often each id occurs in `shards` (int64, length vocab_size): the unigram model that masked-LM
    accuracy is compared with (objectives.mlm.unigram_baseline). One shard in memory at a time."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for shard in shards:
        ids = np.asarray(shard.tokens[:shard.num_tokens])
        if len(ids) and int(ids.max()) >= vocab_size:
            raise ValueError(f"{shard.path}: token id {int(ids.max())} >= vocab_size {vocab_size}")
        counts += np.bincount(ids, minlength=vocab_size)
    return counts
