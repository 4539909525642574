"""3. Contextual vs static. word2vec gives "bank" one vector, whether the sentence is about a river or
money (Mikolov et al. 2013); a Transformer's output for "bank" is computed from the whole sentence
(the notes' ELMo/BERT motivation). Measured on sentences written for two senses of each ambiguous word:
the cosine between occurrences of the same sense vs different senses, and how often the nearest other
occurrence has the same sense (leave-one-out nearest neighbour), for word2vec (trained here on the
Gutenberg books + WikiText-2), MiniLM's embedding layer (token + position, before any attention) and
MiniLM's last layer. The word2vec vectors' own quality is checked on a small similarity and analogy set."""
from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import torch

from ..data.skipgram import read_sentences
from ..interop.api import load, load_tokenizer
from ..training.word2vec import WordVectors, train_word2vec
from .report import Report, bar_plot

NAME = "senses"
CLAIM = ("Static embeddings give a word one vector for all its senses; contextual ones separate the senses "
         "by the sentence around the word.")

# word -> (sense, sentences); each sentence contains the word exactly once, as a whole word.
SENSES: dict[str, dict[str, list[str]]] = {
    "bank": {"river": ["We sat on the grassy bank and watched the river flow.",
                       "The boat drifted toward the muddy bank of the stream.",
                       "Reeds grew thick along the bank where the water was shallow.",
                       "He fished from the bank of the lake all afternoon."],
             "money": ["She deposited her salary at the bank on Monday.",
                       "The bank raised its interest rates on loans.",
                       "He withdrew cash from the bank to pay the rent.",
                       "The bank approved the mortgage after a long review."]},
    "bat": {"animal": ["A bat flew out of the cave at dusk.",
                       "The bat hung upside down from the branch and slept.",
                       "Every night the bat hunts moths and insects.",
                       "The bat uses echoes to find its way in the dark."],
            "sport": ["He swung the bat and hit the ball over the fence.",
                      "The cricket player gripped his bat tightly.",
                      "She bought a new wooden bat for the baseball season.",
                      "The batter dropped the bat and ran to first base."]},
    "flies": {"verb": ["Time flies when you are having fun.",
                       "The eagle flies high above the mountains.",
                       "She flies to Paris every month for work.",
                       "The flag flies over the castle in the wind."],
              "noun": ["The flies buzzed around the rotten fruit.",
                       "He swatted the flies away from his food.",
                       "Fruit flies breed quickly in warm kitchens.",
                       "The horse's tail swished at the flies."]},
    "spring": {"season": ["The flowers bloom in spring after the long winter.",
                          "We plant the garden every spring when it gets warm.",
                          "In spring the days grow longer and the birds return.",
                          "The lambs are born in early spring."],
               "coil": ["The spring in the old mattress was broken.",
                        "He compressed the metal spring and let it go.",
                        "The watch stopped because its spring had snapped.",
                        "A steel spring pushes the door shut."]},
    "match": {"game": ["The football match ended in a draw.",
                       "They won the tennis match in three sets.",
                       "Thousands of fans watched the match in the stadium.",
                       "The chess match lasted for five hours."],
              "fire": ["He struck a match to light the candle.",
                       "The match burned down to her fingers.",
                       "She lit the stove with a single match.",
                       "The wet match would not catch fire."]},
}

# word2vec's own quality: (word, a related word, an unrelated word) and analogies a:b :: c:d.
SIMILARITY = [("king", "queen", "table"), ("man", "woman", "river"), ("father", "mother", "window"),
              ("brother", "sister", "horse"), ("sea", "ocean", "father"), ("house", "room", "anger"),
              ("happy", "glad", "ship"), ("night", "day", "hand"), ("eyes", "face", "money"),
              ("ship", "boat", "heart"), ("sword", "knife", "daughter"), ("horse", "carriage", "sorrow"),
              ("tea", "bread", "war"), ("black", "white", "sister"), ("laughed", "smiled", "door"),
              ("wife", "husband", "tree")]
ANALOGIES = [("man", "woman", "king", "queen"), ("he", "she", "his", "her"), ("father", "mother", "son", "daughter"),
             ("brother", "sister", "father", "mother"), ("husband", "wife", "man", "woman"),
             ("boy", "girl", "man", "woman"), ("sir", "madam", "mr", "mrs"), ("uncle", "aunt", "brother", "sister")]


def word_quality(vectors: WordVectors) -> dict[str, float]:
    sim = [vectors.similarity(w, r) > vectors.similarity(w, u) for w, r, u in SIMILARITY
           if all(x in vectors for x in (w, r, u))]
    ana = [vectors.analogy(a, b, c)[0] == d for a, b, c, d in ANALOGIES if all(x in vectors for x in (a, b, c, d))]
    return {"similarity": float(np.mean(sim)) if sim else float("nan"), "similarity_n": len(sim),
            "analogy": float(np.mean(ana)) if ana else float("nan"), "analogy_n": len(ana)}


def _word_span(tokenizer, sentence: str, word: str) -> tuple[list[int], list[int]]:
    enc = tokenizer(sentence)
    words = sentence.lower().replace(".", " ").replace(",", " ").replace("'", " ").split()
    target = words.index(word)
    ids, word_ids = enc["input_ids"][0] if isinstance(enc["input_ids"][0], list) else enc["input_ids"], enc.word_ids(0)
    # word_ids counts pre-tokenized words (punctuation splits them as our simple split does)
    pieces = [i for i, w in enumerate(word_ids) if w == target]
    if not pieces:
        raise ValueError(f"{word!r} not found as a whole word in {sentence!r}")
    return ids, pieces


def contextual_vectors(model, tokenizer, word: str, sentences: list[str]) -> dict[str, np.ndarray]:
    """The word's vector in each sentence (mean of its word pieces) from the embedding layer and the last layer."""
    layers = {"MiniLM embedding layer": [], "MiniLM last layer": []}
    for sentence in sentences:
        ids, pieces = _word_span(tokenizer, sentence, word)
        with torch.no_grad():
            out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
        hidden = out.hidden_states
        layers["MiniLM embedding layer"].append(hidden[0][0, pieces].mean(0).numpy())
        layers["MiniLM last layer"].append(hidden[-1][0, pieces].mean(0).numpy())
    return {k: np.stack(v) for k, v in layers.items()}


def sense_scores(vectors: np.ndarray, senses: list[int]) -> tuple[float, float, float]:
    """(mean cosine within a sense, mean cosine across senses, leave-one-out nearest-neighbour accuracy)."""
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True).clip(1e-12)
    cos = unit @ unit.T
    within = [cos[i, j] for i, j in itertools.combinations(range(len(senses)), 2) if senses[i] == senses[j]]
    across = [cos[i, j] for i, j in itertools.combinations(range(len(senses)), 2) if senses[i] != senses[j]]
    np.fill_diagonal(cos, -np.inf)
    # ties (identical static vectors) count as chance: the nearest is any other occurrence
    nearest = [np.mean([senses[j] == senses[i] for j in np.flatnonzero(np.isclose(row, row.max()))])
               for i, row in enumerate(cos)]
    return float(np.mean(within)), float(np.mean(across)), float(np.mean(nearest))


def run(out: Path, *, tiny: bool = False, data: Path | None = None) -> Report:
    if data is None:
        raise ValueError("senses needs the data directory (ATTNLAB_DATA or --data)")
    files = [data / "tiny_shakespeare" / "input.txt"] if tiny else \
        sorted((data / "gutenberg").glob("*.txt")) + [data / "wikitext-2" / "valid.txt"]
    text = read_sentences(files)
    settings = dict(dim=32, epochs=1, min_count=2) if tiny else dict(dim=100, epochs=5, min_count=5)
    w2v = train_word2vec(text, window=5, negative=5, sample=1e-3, seed=0, **settings)
    quality = word_quality(w2v)
    model, tokenizer = load("minilm").eval(), load_tokenizer("minilm")
    words = list(SENSES)[:2] if tiny else list(SENSES)
    rows, gaps = [], {"word2vec": [], "MiniLM embedding layer": [], "MiniLM last layer": []}
    for word in words:
        sentences, senses = [], []
        for k, (sense, group) in enumerate(SENSES[word].items()):
            sentences += group
            senses += [k] * len(group)
        reps = contextual_vectors(model, tokenizer, word, sentences)
        if word in w2v:  # static: the same vector in every sentence
            reps = {"word2vec": np.stack([w2v[word].numpy()] * len(sentences)), **reps}
        for name, vecs in reps.items():
            within, across, nn_acc = sense_scores(vecs, senses)
            gaps[name].append(within - across)
            rows.append([word, name, round(within, 3), round(across, 3), round(within - across, 3), f"{nn_acc:.0%}"])
    mean_gap = {k: float(np.mean(v)) if v else float("nan") for k, v in gaps.items()}
    figure = bar_plot(out / f"{NAME}.png", words, {k: v for k, v in gaps.items() if len(v) == len(words)},
                      ylabel="cosine within sense − across senses",
                      title="separating two senses of a word (higher = senses apart)")
    holds = mean_gap["MiniLM last layer"] > 0.05 and abs(mean_gap["word2vec"]) < 1e-6 \
        and mean_gap["MiniLM last layer"] > mean_gap["MiniLM embedding layer"]
    verdict = (f"Mean within-minus-across cosine gap: word2vec {mean_gap['word2vec']:.3f} (one vector, the senses "
               f"cannot differ), MiniLM's embedding layer {mean_gap['MiniLM embedding layer']:.3f} (position only), "
               f"MiniLM's last layer {mean_gap['MiniLM last layer']:.3f}.")
    notes = [f"word2vec ({settings['dim']} dims, {len(w2v.words):,} words, {sum(map(len, text)):,} training words): "
             f"related word nearer than an unrelated one in {quality['similarity']:.0%} of "
             f"{quality['similarity_n']} triples; analogies (3CosAdd, top-1) {quality['analogy']:.0%} of "
             f"{quality['analogy_n']}."]
    for probe in ("bank", "spring", "match"):
        if probe in w2v:
            notes.append(f"word2vec's neighbours of {probe!r}: "
                         + ", ".join(w for w, _ in w2v.most_similar(probe, 8)) + ".")
    return Report(NAME, CLAIM, ["word", "representation", "cos within sense", "cos across senses", "gap",
                                "nearest occurrence same sense"], rows, verdict, holds,
                  settings={**settings, "sentences_per_sense": 4, "tiny": tiny}, notes=notes, figure=figure)
