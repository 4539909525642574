"""Skip-gram word2vec: the pair generator follows word2vec.c's rules, vectors round-trip through the
word2vec text format, and on real text the neighbours agree with gensim's (the oracle)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab.data.skipgram import WordCorpus, read_sentences, words_of
from attnlab.training.word2vec import WordVectors, train_word2vec


def test_words_of_keeps_inner_apostrophes_and_drops_the_rest():
    assert words_of("Don't stop, 42 Bank's -- 'twas") == ["don't", "stop", "bank's", "twas"]


def test_pairs_stay_inside_sentences_and_windows():
    corpus = WordCorpus.from_sentences([["a", "b", "c", "d"], ["e", "f"]], min_count=1)
    c, o = corpus.pairs(window=1, sample=0, rng=np.random.default_rng(0))
    got = sorted((corpus.words[i], corpus.words[j]) for i, j in zip(c, o))
    # window 1, no subsampling: each neighbour both ways, never d-e across the sentence break
    assert got == sorted([("a", "b"), ("b", "a"), ("b", "c"), ("c", "b"), ("c", "d"), ("d", "c"),
                          ("e", "f"), ("f", "e")])


def test_dynamic_window_never_exceeds_the_window_and_reaches_it():
    corpus = WordCorpus.from_sentences([[str(i) for i in range(50)]] * 20, min_count=1)
    c, o = corpus.pairs(window=3, sample=0, rng=np.random.default_rng(1))
    distance = np.abs(np.array([int(corpus.words[i]) for i in c]) - np.array([int(corpus.words[j]) for j in o]))
    assert distance.min() == 1 and distance.max() == 3
    # nearer words are seen more often (b ~ U{1..3}: offset 1 always, offset 3 a third of the time)
    assert (distance == 1).sum() > 2 * (distance == 3).sum()


def test_subsampling_formula_matches_word2vec_c():
    corpus = WordCorpus.from_sentences([["x"] * 90 + ["y"] * 10], min_count=1)
    keep = corpus.keep_probability(1e-2)
    t = 1e-2 * 100
    assert keep[0] == pytest.approx((np.sqrt(90 / t) + 1) * t / 90)
    assert keep[1] == pytest.approx(min(1.0, (np.sqrt(10 / t) + 1) * t / 10))


def test_min_count_error_names_the_setting():
    with pytest.raises(ValueError, match="min_count"):
        WordCorpus.from_sentences([["a", "b"]], min_count=5)


def test_training_pulls_cooccurring_words_together():
    # two "topics" that never share a sentence: words within a topic end up nearer than across
    rng = np.random.default_rng(0)
    a, b = [f"sky{i}" for i in range(40)], [f"sea{i}" for i in range(40)]
    sentences = [[str(w) for w in rng.choice(a if i % 2 else b, 8)] for i in range(2000)]
    vectors = train_word2vec(sentences, dim=16, window=3, min_count=1, sample=0, epochs=3, seed=0)
    within = np.mean([vectors.similarity(x, y) for x in a for y in a if x != y])
    across = np.mean([vectors.similarity(x, y) for x in a for y in b])
    assert within > across + 0.3


def test_word2vec_text_format_round_trip_and_gensim_reads_it(tmp_path):
    gensim = pytest.importorskip("gensim")
    vectors = WordVectors(["alpha", "beta", "gamma"], torch.randn(3, 4))
    path = vectors.save(tmp_path / "v.txt")
    back = WordVectors.load(path)
    assert back.words == vectors.words and torch.allclose(back.vectors, vectors.vectors, atol=1e-5)
    kv = gensim.models.KeyedVectors.load_word2vec_format(str(path))
    assert np.allclose(kv["beta"], vectors["beta"].numpy(), atol=1e-5)
    (tmp_path / "bad.txt").write_text("2 4\nalpha 1 2 3\n", encoding="utf-8")
    with pytest.raises(ValueError, match="bad.txt:2: expected a word and 4 numbers"):
        WordVectors.load(tmp_path / "bad.txt")


def test_neighbours_agree_with_gensim_on_real_text(data_dir):
    """Same text, same settings (skip-gram, dim 100, window 5, 5 negatives, min_count 5, sample 1e-3,
    5 epochs): the top-10 neighbours of 200 mid-frequency words overlap gensim's by >= 0.5 on average
    (two gensim runs with different seeds overlap each other by about 0.58 on this text)."""
    gensim = pytest.importorskip("gensim")
    sentences = read_sentences([data_dir / "tiny_shakespeare" / "input.txt"])
    ours = train_word2vec(sentences, dim=100, window=5, negative=5, min_count=5, sample=1e-3, epochs=5, seed=0)
    theirs = gensim.models.Word2Vec(sentences, vector_size=100, window=5, negative=5, min_count=5,
                                    sample=1e-3, epochs=5, sg=1, workers=1, seed=0).wv
    words = ours.words[50:250]  # past the stop words, still frequent enough to have stable neighbours
    overlap = np.mean([len({w for w, _ in ours.most_similar(q, 10)} &
                           set(theirs.index_to_key[i] for i in
                               np.argsort(-theirs.cosine_similarities(theirs[q], theirs.vectors))[1:11])) / 10
                       for q in words])
    assert overlap >= 0.5, f"top-10 overlap with gensim {overlap:.3f}"


@pytest.mark.slow
def test_nearest_neighbour_quality_on_the_similarity_set(data_dir):
    """Trained on two novels, a related word (king: queen) is nearer than an unrelated one (king: table)
    for at least 80% of the hand-written triples of the senses experiment (all 15 of them on this machine)."""
    from attnlab.experiments.senses import word_quality
    books = [data_dir / "gutenberg" / name for name in ("1400-0.txt", "98-0.txt")]
    quality = word_quality(train_word2vec(read_sentences(books), dim=64, epochs=3, seed=0))
    assert quality["similarity_n"] >= 12 and quality["similarity"] >= 0.8, quality
