"""Static word embeddings: skip-gram with negative sampling (word2vec; Mikolov et al. 2013), the notes'
starting point before contextual models. One vector per word type, whatever the sentence — the
limitation the "bank"/"bat" experiment measures against MiniLM.

Training is plain SGD on two tables, as word2vec.c does: for a (center, context) pair and k noise words,
maximise log σ(u_ctx·v_c) + Σ log σ(−u_noise·v_c). The update is written out (index_add_ on the rows
a batch touches) rather than left to autograd: one batch touches a few thousand of the vocabulary's
rows, and a dense gradient of the whole table per step would cost far more than the maths.

    vectors = train_word2vec(read_sentences(["book.txt"]), dim=100, epochs=5)
    vectors.most_similar("king", 5)
"""
from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from ..data.skipgram import WordCorpus


@dataclass
class WordVectors:
    words: list[str]
    vectors: torch.Tensor          # (vocab, dim) float32, the input ("center") table

    def __post_init__(self) -> None:
        self._index = {w: i for i, w in enumerate(self.words)}
        self._unit = torch.nn.functional.normalize(self.vectors, dim=1)

    def __contains__(self, word: str) -> bool:
        return word in self._index

    def __getitem__(self, word: str) -> torch.Tensor:
        if word not in self._index:
            raise KeyError(f"{word!r} is not in the vocabulary ({len(self.words)} words)")
        return self.vectors[self._index[word]]

    def similarity(self, a: str, b: str) -> float:
        """Cosine of two words' vectors."""
        self[a], self[b]  # a missing word: KeyError naming it
        return float(self._unit[self._index[a]] @ self._unit[self._index[b]])

    def most_similar(self, word: str, n: int = 10) -> list[tuple[str, float]]:
        """The n nearest words by cosine, the word itself excluded."""
        i = self._index.get(word)
        if i is None:
            raise KeyError(f"{word!r} is not in the vocabulary ({len(self.words)} words)")
        scores = self._unit @ self._unit[i]
        scores[i] = -2.0
        top = torch.topk(scores, min(n, len(self.words) - 1))
        return [(self.words[j], float(s)) for s, j in zip(top.values, top.indices)]

    def analogy(self, a: str, b: str, c: str, n: int = 1) -> list[str]:
        """a is to b as c is to ?  (3CosAdd: nearest to b − a + c, the three inputs excluded)."""
        query = self._unit[self._index[b]] - self._unit[self._index[a]] + self._unit[self._index[c]]
        scores = self._unit @ torch.nn.functional.normalize(query, dim=0)
        for w in (a, b, c):
            scores[self._index[w]] = -2.0
        return [self.words[j] for j in torch.topk(scores, n).indices]

    def save(self, path: str | Path) -> Path:
        """The word2vec text format (gensim's `KeyedVectors.load_word2vec_format` reads it), written
        to a temporary file and renamed, so a killed run never leaves half a file."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(f"{len(self.words)} {self.vectors.shape[1]}\n")
            for word, row in zip(self.words, self.vectors.tolist()):
                f.write(word + " " + " ".join(f"{x:.6g}" for x in row) + "\n")
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "WordVectors":
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        try:
            n, dim = map(int, lines[0].split())
        except (IndexError, ValueError):
            raise ValueError(f"{path}: the first line must be 'WORDS DIM' (word2vec text format)") from None
        words, rows = [], []
        for lineno, line in enumerate(lines[1:n + 1], start=2):
            parts = line.rstrip().split(" ")
            if len(parts) != dim + 1:
                raise ValueError(f"{path}:{lineno}: expected a word and {dim} numbers, got {len(parts) - 1}")
            words.append(parts[0])
            rows.append([float(x) for x in parts[1:]])
        return cls(words, torch.tensor(rows, dtype=torch.float32))


def train_word2vec(sentences: Sequence[list[str]], *, dim: int = 100, window: int = 5, negative: int = 5,
                   min_count: int = 5, sample: float = 1e-3, epochs: int = 5, lr: float = 0.025,
                   min_lr: float = 1e-4, batch_size: int = 1024, seed: int = 0,
                   progress: bool = False) -> WordVectors:
    """Skip-gram with negative sampling; defaults are word2vec.c's / gensim's (sg=1)."""
    corpus = WordCorpus.from_sentences(sentences, min_count=min_count)
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    vocab = len(corpus.words)
    # word2vec.c's initialisation: small uniform input vectors, zero output vectors.
    w_in = (torch.rand(vocab, dim, generator=gen) - 0.5) / dim
    w_out = torch.zeros(vocab, dim)
    noise = torch.from_numpy(corpus.negative_table())
    # The learning rate decays over the pairs of the whole run; an epoch's count varies with the
    # random subsampling, so one draw estimates it.
    total = max(1, epochs * corpus.pairs(window, sample, np.random.default_rng(seed + 1))[0].size)
    done, started = 0, time.time()
    for epoch in range(epochs):
        centers, contexts = corpus.pairs(window, sample, rng)
        centers, contexts = torch.from_numpy(centers.astype(np.int64)), torch.from_numpy(contexts.astype(np.int64))
        for start in range(0, len(centers), batch_size):
            c, o = centers[start:start + batch_size], contexts[start:start + batch_size]
            alpha = max(min_lr, lr * (1 - done / total))   # linear decay over the whole run, as word2vec.c
            negs = torch.searchsorted(noise, torch.rand(len(c), negative, generator=gen)).clamp_(max=vocab - 1)
            targets = torch.cat([o[:, None], negs], dim=1)             # (B, 1+k)
            labels = torch.zeros(targets.shape)
            labels[:, 0] = 1.0
            v = w_in[c]                                                # (B, d)
            u = w_out[targets]                                         # (B, 1+k, d)
            g = (labels - torch.sigmoid(torch.einsum("bkd,bd->bk", u, v))) * alpha
            w_in.index_add_(0, c, torch.einsum("bk,bkd->bd", g, u))
            w_out.index_add_(0, targets.reshape(-1), (g[..., None] * v[:, None, :]).reshape(-1, dim))
            done += len(c)
        if progress:
            print(f"word2vec epoch {epoch + 1}/{epochs}: {len(centers):,} pairs, "
                  f"{time.time() - started:.0f} s", flush=True)
    return WordVectors(corpus.words, w_in)
