"""Text -> word ids -> (center, context) pairs for skip-gram word2vec (Mikolov et al. 2013, "Distributed
Representations of Words and Phrases"): a frequency-cut vocabulary, frequent-word subsampling, a
dynamic window, and the unigram^0.75 table negatives are drawn from.

The rules follow the original word2vec C tool (and gensim, which the tests use as the oracle), so
that the same text with the same settings gives comparable vectors:

>>> corpus = WordCorpus.from_sentences([["the", "cat", "sat"], ["the", "dog", "sat"]], min_count=1)
>>> corpus.words[:2], corpus.counts[:2].tolist()
(['the', 'sat'], [2, 2])
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")


def words_of(line: str) -> list[str]:
    """Lowercased words, apostrophes kept inside a word ("don't"); numbers and punctuation dropped."""
    return _WORD.findall(line.lower())


def read_sentences(paths: Sequence[str | Path], min_words: int = 2) -> list[list[str]]:
    """One "sentence" per non-blank line (lines of a book are short; a window never crosses a line,
    as in gensim's LineSentence). Files are read as UTF-8; a bad file names itself."""
    out: list[list[str]] = []
    for path in paths:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
        for line in text.splitlines():
            words = words_of(line)
            if len(words) >= min_words:
                out.append(words)
    if not out:
        raise ValueError(f"no sentences of at least {min_words} words in {', '.join(map(str, paths))}")
    return out


@dataclass
class WordCorpus:
    words: list[str]              # id -> word, most frequent first (ties: first seen first)
    counts: np.ndarray            # id -> count in the text
    tokens: np.ndarray            # the text as ids (out-of-vocabulary words dropped), int32
    sentence: np.ndarray          # sentence index of each token, int32: windows stay inside one

    @classmethod
    def from_sentences(cls, sentences: Iterable[list[str]], min_count: int = 5) -> "WordCorpus":
        sentences = list(sentences)
        freq = Counter(w for s in sentences for w in s)
        kept = [w for w, c in sorted(freq.items(), key=lambda kv: -kv[1]) if c >= min_count]
        if not kept:
            raise ValueError(f"no word occurs {min_count} times; lower min_count")
        index = {w: i for i, w in enumerate(kept)}
        ids, sent = [], []
        for n, s in enumerate(sentences):
            row = [index[w] for w in s if w in index]
            ids.extend(row)
            sent.extend([n] * len(row))
        return cls(kept, np.array([freq[w] for w in kept], dtype=np.int64),
                   np.array(ids, dtype=np.int32), np.array(sent, dtype=np.int32))

    @property
    def index(self) -> dict[str, int]:
        return {w: i for i, w in enumerate(self.words)}

    def keep_probability(self, sample: float) -> np.ndarray:
        """word2vec.c's subsampling: keep a word of frequency f with probability
        (sqrt(f / (sample * total)) + 1) * sample * total / f, capped at 1."""
        if sample <= 0:
            return np.ones(len(self.words))
        threshold = sample * self.counts.sum()
        return np.minimum(1.0, (np.sqrt(self.counts / threshold) + 1) * threshold / self.counts)

    def negative_table(self, power: float = 0.75) -> np.ndarray:
        """Cumulative distribution of the noise words: unigram counts raised to 3/4 (Mikolov et al. 2013 sec. 2.2)."""
        weights = self.counts.astype(np.float64) ** power
        return np.cumsum(weights / weights.sum())

    def pairs(self, window: int, sample: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """One epoch of (center, context) ids, shuffled. Each kept token gets a window b drawn uniformly
        from 1..window (nearer words count more, as in word2vec.c); windows are measured after
        subsampling and never cross a sentence."""
        keep = rng.random(len(self.tokens)) < self.keep_probability(sample)[self.tokens]
        tokens, sentence = self.tokens[keep], self.sentence[keep]
        reach = rng.integers(1, window + 1, size=len(tokens))
        centers, contexts = [], []
        for offset in range(1, window + 1):
            same = sentence[:-offset] == sentence[offset:]
            left = same & (reach[:-offset] >= offset)      # center i sees i + offset
            right = same & (reach[offset:] >= offset)      # center i + offset sees i
            centers += [tokens[:-offset][left], tokens[offset:][right]]
            contexts += [tokens[offset:][left], tokens[:-offset][right]]
        c, o = np.concatenate(centers), np.concatenate(contexts)
        order = rng.permutation(len(c))
        return c[order], o[order]
