"""Arbitrary Unicode in, no crash out: tokenizers (BERT WordPiece, GPT-2 byte-level BPE, characters, Unigram) and the
task readers (GLUE tsv, CoNLL, SQuAD json) under hypothesis with combining marks, emoji, right-to-left
text, NUL and other controls, very long words and empty strings. Offsets always lie inside the text and
cover the token's characters; byte-level BPE decodes back to the exact input; a malformed file is a
DataError (a ValueError) naming the file and the line."""
from __future__ import annotations

import json
import os
import tempfile
import unicodedata
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, note, settings, strategies as st

from attnlab.tasks.common import DataError
from attnlab.tokenizers import build_char_tokenizer, load_tokenizer

FUZZ = settings(max_examples=int(os.environ.get("ATTNLAB_FUZZ_EXAMPLES", 150)), deadline=None,
                suppress_health_check=list(HealthCheck))

# the nasty parts of Unicode, mixed into ordinary text (hypothesis' text() never yields lone surrogates)
SPECIAL = ["\u0301", "\u0308", "\u200d", "\u200b", "\ufeff", "\u202e", "\u2028", "\x00", "\x1c", "\r", "\t", "\n",
           "👩‍👩‍👧", "🇫🇷", "🙂", "שלום", "مرحبا", "日本語", "ﬁ", "ß", "İ", "Ⅻ", "①", "\ufffd", "e\u0301", "[CLS]", "[UNK]",
           "<|endoftext|>", "##", "  ", "a" * 300]
texts = st.lists(st.text(max_size=12) | st.sampled_from(SPECIAL), max_size=8).map("".join)


@pytest.fixture(scope="module")
def wordpiece(data_dir):
    return load_tokenizer(data_dir / "vocab" / "bert-base-uncased")


@pytest.fixture(scope="module")
def bpe(data_dir):
    return load_tokenizer(data_dir / "vocab" / "gpt2")


@pytest.fixture(scope="module")
def chars(tmp_path_factory):
    path = tmp_path_factory.mktemp("char") / "corpus.txt"
    path.write_text("abc déf 🙂 שלום\n\t", encoding="utf-8")
    return build_char_tokenizer([path])


def _offsets(tok, text: str):
    enc = tok(text, return_offsets=True, truncation=False)
    tokens = enc.encodings[0].tokens
    specials = set(tok.special_ids)
    return [(t, i, s, e) for t, i, (s, e) in zip(tokens, enc["input_ids"], enc["offset_mapping"])], specials


def _fold(text: str) -> str:
    """BERT's uncased normalisation, roughly: drop control characters (its clean_text: "0\x1f0" is one
    word "00"), lower-case, decompose, drop combining marks."""
    text = "".join(c for c in text if c in "\t\n\r" or unicodedata.category(c) not in ("Cc", "Cf")
                   and c != "\ufffd")
    return "".join(c for c in unicodedata.normalize("NFD", text.lower()) if unicodedata.category(c) != "Mn")


@FUZZ
@given(texts)
def test_wordpiece_offsets(wordpiece, text):
    note(repr(text))
    rows, specials = _offsets(wordpiece, text)
    for token, i, s, e in rows:
        assert 0 <= s <= e <= len(text)
        if i in specials:
            continue
        assert s < e, f"token {token!r} has an empty span"
        if token != wordpiece.special_tokens["unk_token"]:
            piece = token.removeprefix("##")
            span = text[s:e]
            if span.isascii():  # beyond ASCII, the Rust and Python case tables may differ (İ, ß, ...)
                assert _fold(span) == piece, (token, span)
            else:
                assert _fold(span) or span, (token, span)


@FUZZ
@given(texts)
def test_bpe_round_trip_and_offsets(bpe, text):
    note(repr(text))
    ids = bpe.encode(text, add_special_tokens=False)
    assert bpe.decode(ids, skip_special_tokens=False) == text
    rows, _ = _offsets(bpe, text)
    for token, _, s, e in rows:
        assert 0 <= s <= e <= len(text)
        assert s < e or not text, f"token {token!r} has an empty span"
    if rows:  # the spans cover the text, in order
        assert rows[0][2] == 0 and rows[-1][3] == len(text)


@FUZZ
@given(texts)
def test_char_tokenizer(chars, text):
    note(repr(text))
    rows, specials = _offsets(chars, text)
    known = set(chars.get_vocab())
    for token, i, s, e in rows:
        assert 0 <= s <= e <= len(text)
        assert s < e
        if token != "[UNK]":
            assert text[s:e] == token
    if all(c in known for c in text) and "[UNK]" not in text:
        assert chars.decode(chars.encode(text)) == text


@pytest.fixture(scope="module")
def unigram(tmp_path_factory, data_dir):
    from attnlab.tokenizers import train_tokenizer
    return train_tokenizer("unigram", [data_dir / "multi30k" / "val.de"], 400)


@FUZZ
@given(texts)
def test_unigram_offsets_and_round_trip(unigram, text):
    note(repr(text))
    rows, _ = _offsets(unigram, text)
    for token, i, s, e in rows:
        assert 0 <= s <= e <= len(text)
    known = {t for t in unigram.get_vocab() if len(t) == 1} - {"\u2581"}  # single characters, not "▁"
    if all(c in known or c == " " for c in text):  # then only runs of spaces change: collapsed and trimmed
        assert unigram.decode(unigram.encode(text)) == " ".join(w for w in text.split(" ") if w)


@FUZZ
@given(st.lists(texts, min_size=1, max_size=4), st.booleans())
def test_batches_and_pairs_never_crash(wordpiece, batch, pair):
    enc = wordpiece(batch, batch if pair else None, padding=True, max_length=32, return_tensors="pt")
    assert enc["input_ids"].shape[0] == len(batch) and enc["input_ids"].shape[1] <= 32


# ---------------------------------------------------------------------------------------- task readers
def _file(tmp: str, name: str, content: str | bytes) -> Path:
    path = Path(tmp) / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


def read_task_file(task_name: str, content: str | bytes):
    """(task, examples) read from a temporary file holding `content`, or (task, None) after checking
    that the DataError names the file. Warnings (skipped questions) are silenced."""
    import warnings
    from attnlab.tasks import get_task
    task = get_task(task_name)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = _file(tmp, "data.txt", content)
        try:
            return task, task.read(path)
        except DataError as err:
            assert str(path) in str(err), str(err)
            return task, None


cells = texts.map(lambda t: t.replace("\t", " ").replace("\n", " ").replace("\r", " "))


@FUZZ
@given(st.lists(st.tuples(cells, st.sampled_from(["0", "1", "x", ""]), st.booleans()), max_size=6))
def test_glue_tsv(wordpiece, rows):
    lines = ["sentence\tlabel"] + [f"{s}\t{label}" if full else s for s, label, full in rows]
    task, examples = read_task_file("sst2", "\n".join(lines) + "\n")
    if examples is None:
        return
    feats = task.features(examples, wordpiece, 32, {k: i for i, k in enumerate(task.label_list(examples))},
                          training=True)
    assert len(feats) == len(examples)
    for ex in examples:
        assert 1 <= ex["line"] <= len(lines)


@FUZZ
@given(st.lists(st.one_of(st.just(""), st.just("-DOCSTART- -X- O O"),
                          st.tuples(cells, st.sampled_from(["O", "B-PER", "I-LOC"])).map(" ".join), cells),
                max_size=10))
def test_conll(wordpiece, lines):
    task, examples = read_task_file("conll2003", "\n".join(lines) + "\n")
    if examples is None:
        return
    feats = task.features(examples, wordpiece, 32, {k: i for i, k in enumerate(task.label_list(examples))},
                          training=True)
    assert len(feats) >= len(examples)


json_junk = st.recursive(st.none() | st.booleans() | st.integers() | texts,
                         lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                             st.sampled_from(["data", "paragraphs", "context", "qas", "id", "question", "answers",
                                              "text", "answer_start"]), inner, max_size=4), max_leaves=12)


@st.composite
def squad_docs(draw):
    if draw(st.integers(0, 3)) == 0:
        return draw(json_junk)
    paragraphs = []
    for _ in range(draw(st.integers(0, 2))):
        context = draw(texts)
        qas = []
        for k in range(draw(st.integers(0, 2))):
            start = draw(st.integers(0, len(context)))
            end = draw(st.integers(start, len(context)))
            answer = {"text": context[start:end], "answer_start": start}
            if draw(st.integers(0, 5)) == 0:
                answer = draw(json_junk)
            qas.append({"id": f"q{k}", "question": draw(texts), "answers": [answer]})
        paragraphs.append({"context": context, "qas": qas})
    return {"data": [{"paragraphs": paragraphs}]}


@FUZZ
@given(squad_docs())
def test_squad(wordpiece, doc):
    note(repr(doc))
    task, examples = read_task_file("squad", json.dumps(doc))
    if examples is None:
        return
    feats = task.features(examples, wordpiece, 64, None, training=True)
    for f in feats:
        for s, e in f["offsets"]:
            assert 0 <= s <= e
        assert 0 <= f["start_positions"] <= f["end_positions"] < len(f["input_ids"])


@FUZZ
@given(st.binary(max_size=40), st.sampled_from(["sst2", "conll2003", "squad"]))
def test_readers_on_bytes(data, task_name):
    """Random bytes (invalid UTF-8 included): examples or a DataError naming the file."""
    read_task_file(task_name, data)


def test_invalid_utf8_names_file_and_line(tmp_path):
    from attnlab.tasks import get_task
    path = _file(str(tmp_path), "train.tsv", b"sentence\tlabel\ngood\t1\nbad \xff\xfe\t0\n")
    with pytest.raises(DataError, match=rf"{path}:3: not valid UTF-8"):
        get_task("sst2").read(path)
