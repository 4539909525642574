"""11. Vocabulary overlap. SciBERT (Beltagy et al. 2019, sec. 2) built SciVocab, a WordPiece vocabulary of
the same size as BERT's, on scientific text and found only 42% of its tokens in BERT's BaseVocab: a
domain shifts which words are whole tokens, and an in-domain vocabulary splits in-domain text into
fewer pieces.

Here the domain is 19th-century novels: a WordPiece vocabulary of bert-base-uncased's size trained on the
Gutenberg books (one book held out), compared with bert-base-uncased's own — overlap, and pieces per word
on the held-out book and on WikiText-2 (Wikipedia, BERT's own domain)."""
from __future__ import annotations

import re
import tempfile
from pathlib import Path

from ..tokenizers import load_tokenizer, read_vocab, train_tokenizer
from .report import Report, bar_plot

NAME = "vocab-overlap"
CLAIM = ("A WordPiece vocabulary learned on another domain shares only part of BERT's (SciBERT: 42%), and "
         "it splits in-domain text into fewer pieces.")
SCIBERT_OVERLAP = 0.42
_SPECIAL = re.compile(r"^\[(PAD|UNK|CLS|SEP|MASK|unused\d+)\]$")


def overlap(ours: set[str], theirs: set[str]) -> float:
    """Share of `theirs` (special and [unusedN] tokens aside) that `ours` also has."""
    real = {t for t in theirs if not _SPECIAL.match(t)}
    return len(real & ours) / max(1, len(real))


def pieces_per_word(tokenizer, text: str) -> float:
    words = text.split()
    pieces = sum(len(tokenizer(line, add_special_tokens=False)["input_ids"]) for line in text.splitlines()
                 if line.strip())
    return pieces / max(1, len(words))


def _sample(path: Path, chars: int) -> str:
    return path.read_text(encoding="utf-8")[:chars]


def run(out: Path, *, tiny: bool = False, data: Path | None = None) -> Report:
    if data is None:
        raise ValueError("vocab-overlap needs the data directory (ATTNLAB_DATA or --data)")
    bert_dir = data / "vocab" / "bert-base-uncased"
    bert_vocab = read_vocab(bert_dir / "vocab.txt")
    if tiny:
        train_files, held_out, size = [data / "tiny_shakespeare" / "input.txt"], None, 2000
        domain = _sample(data / "tiny_shakespeare" / "input.txt", 20_000)
    else:
        books = sorted((data / "gutenberg").glob("*.txt"))
        held_out, train_files, size = books[0], books[1:], len(bert_vocab)
        domain = _sample(held_out, 400_000)
    wiki = _sample(data / "wikitext-2" / "valid.txt", 20_000 if tiny else 400_000)
    with tempfile.TemporaryDirectory() as tmp:
        ours = train_tokenizer("wordpiece", train_files, size, lowercase=True)
        ours.save(tmp)
        ours = load_tokenizer(tmp)
    bert = load_tokenizer(bert_dir)
    ours_vocab = set(ours.get_vocab())
    share = overlap(ours_vocab, set(bert_vocab))
    whole = {t for t in ours_vocab if not t.startswith("##") and not _SPECIAL.match(t)}
    only_ours = sorted((t for t in whole - set(bert_vocab) if t.isalpha() and len(t) > 3),
                       key=lambda t: -len(t))[:12]
    fert = {("ours", "books"): pieces_per_word(ours, domain), ("bert", "books"): pieces_per_word(bert, domain),
            ("ours", "wiki"): pieces_per_word(ours, wiki), ("bert", "wiki"): pieces_per_word(bert, wiki)}
    rows = [["vocabulary size", len(ours_vocab), len(bert_vocab)],
            ["share of bert-base-uncased's tokens also in it", f"{share:.1%}", "100%"],
            [f"pieces per word, held-out {'text' if tiny else 'book ' + held_out.name}",
             round(fert["ours", "books"], 3), round(fert["bert", "books"], 3)],
            ["pieces per word, WikiText-2 valid", round(fert["ours", "wiki"], 3), round(fert["bert", "wiki"], 3)]]
    figure = bar_plot(out / f"{NAME}.png", ["held-out book", "WikiText-2 (Wikipedia)"],
                      {"books vocabulary": [fert["ours", "books"], fert["ours", "wiki"]],
                       "bert-base-uncased": [fert["bert", "books"], fert["bert", "wiki"]]},
                      ylabel="WordPiece pieces per whitespace word",
                      title=f"vocabulary overlap {share:.0%} (SciBERT: {SCIBERT_OVERLAP:.0%})")
    in_domain_better = fert["ours", "books"] < fert["bert", "books"]
    partial = share < 0.8
    holds = partial and in_domain_better
    verdict = (f"The books vocabulary shares {share:.1%} of bert-base-uncased's tokens (SciBERT reported "
               f"{SCIBERT_OVERLAP:.0%} for science); it cuts the held-out book into "
               f"{fert['ours', 'books']:.3f} pieces per word vs BERT's {fert['bert', 'books']:.3f}, and Wikipedia "
               f"into {fert['ours', 'wiki']:.3f} vs {fert['bert', 'wiki']:.3f}.")
    return Report(NAME, CLAIM, ["", "vocabulary trained on the books", "bert-base-uncased"], rows, verdict,
                  holds, settings={"vocab_size": size, "train_files": len(train_files), "tiny": tiny},
                  notes=[f"Whole words in the books vocabulary but not in BERT's: {', '.join(only_ours)}."],
                  figure=figure)
