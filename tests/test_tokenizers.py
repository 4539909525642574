"""attnlab.tokenizers against transformers' BertTokenizerFast on real corpora (SST-2, CoNLL-2003)."""
from __future__ import annotations

import doctest
import json
import re
import shutil
import unicodedata
from pathlib import Path

import pytest

import attnlab.tokenizers as tokmod
from attnlab.tokenizers import Tokenizer, build_wordpiece, load_tokenizer

transformers = pytest.importorskip("transformers")

KEYS = ("input_ids", "token_type_ids", "attention_mask")


# ---------------------------------------------------------------------------------------------
# fixtures: the real vocab, the oracle, the corpora

@pytest.fixture(scope="module")
def vocab_file(data_dir: Path) -> Path:
    return data_dir / "vocab" / "bert-base-uncased" / "vocab.txt"


@pytest.fixture(scope="module")
def vocab_dir(vocab_file: Path, tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("bert_vocab")
    shutil.copy(vocab_file, d / "vocab.txt")
    return d


@pytest.fixture(scope="module")
def hf(vocab_dir: Path):
    # from_pretrained(dir), never BertTokenizer(vocab_file=...): transformers 5 ignores that file.
    return transformers.BertTokenizerFast.from_pretrained(str(vocab_dir))


@pytest.fixture(scope="module")
def tok(vocab_dir: Path) -> Tokenizer:
    return load_tokenizer(vocab_dir)


@pytest.fixture(scope="module")
def sst2(data_dir: Path) -> list[str]:
    lines = (data_dir / "glue" / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()
    assert lines[0] == "sentence\tlabel"
    sentences = [line.rsplit("\t", 1)[0] for line in lines[1:]]
    assert len(sentences) == 67_349
    return sentences


@pytest.fixture(scope="module")
def conll(data_dir: Path) -> list[list[str]]:
    sentences, words = [], []
    for line in (data_dir / "conll2003" / "train.txt").read_text(encoding="utf-8").splitlines():
        if not line.strip():
            if words:
                sentences.append(words)
            words = []
        elif not line.startswith("-DOCSTART-"):
            words.append(line.split(" ")[0])
    if words:
        sentences.append(words)
    assert len(sentences) == 14_041 and sum(map(len, sentences)) == 203_621
    return sentences


def assert_same(ours, theirs, keys=KEYS):
    for key in keys:
        a, b = ours[key], theirs[key]
        if hasattr(a, "tolist"):
            a, b = a.tolist(), b.tolist()
        mismatch = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        assert len(a) == len(b) and mismatch is None, f"{key} differs at row {mismatch}: {a[mismatch]} vs {b[mismatch]}"


# ---------------------------------------------------------------------------------------------
# parity with transformers on whole corpora

def test_sst2_all_sentences_match_transformers(tok, hf, sst2):
    ours = tok(sst2)
    assert max(map(len, ours["input_ids"])) < tok.model_max_length  # so default truncation is a no-op
    assert_same(ours, hf(sst2))


def test_conll_joined_and_split_words_match_transformers(tok, hf, conll):
    joined = [" ".join(words) for words in conll]
    ours_joined = tok(joined)
    assert_same(ours_joined, hf(joined))
    ours_split = tok(conll, is_split_into_words=True)
    assert_same(ours_split, hf(conll, is_split_into_words=True))
    assert ours_split["input_ids"] == ours_joined["input_ids"]  # no CoNLL token contains a space
    # word_ids map every sub-word back to its CoNLL word (what NER label alignment needs)
    word_ids = ours_split.word_ids(0)
    assert word_ids[0] is None and word_ids[-1] is None and max(w for w in word_ids if w is not None) == len(conll[0]) - 1


def test_sst2_pairs_longest_first_and_padding_match_transformers(tok, hf, sst2):
    first, second = sst2[:24_000], sst2[1:24_001]  # a third of the file: each pair tokenized twice
    ours = tok(first, second, max_length=32)
    theirs = hf(first, second, max_length=32, truncation="longest_first")
    assert_same(ours, theirs, ("input_ids", "token_type_ids"))
    lengths = list(map(len, ours["input_ids"]))
    assert max(lengths) == 32 and sum(n == 32 for n in lengths) > 300  # truncation really happened
    few_a, few_b = first[:8000], second[:8000]  # padding on a slice: the ids are already checked above
    assert_same(tok(few_a, few_b, max_length=32, padding="longest"),
                hf(few_a, few_b, max_length=32, truncation=True, padding="longest"))
    # a list of (a, b) tuples is the same as text + text_pair; tensors equal transformers' too
    some = list(zip(first[:64], second[:64]))
    assert tok(some, max_length=32)["input_ids"] == ours["input_ids"][:64]
    assert_same(tok(first[:64], second[:64], max_length=32, padding=True, return_tensors="pt"),
                hf(first[:64], second[:64], max_length=32, truncation=True, padding=True, return_tensors="pt"))


# ---------------------------------------------------------------------------------------------
# offsets, loading paths, saving

def _fold(s: str) -> str:
    # BERT-uncased's normalizer: lower-case and drop accents (NFD, remove combining marks)
    return "".join(c for c in unicodedata.normalize("NFD", s.lower()) if unicodedata.category(c) != "Mn")


def test_offsets_point_at_the_token_text(tok, sst2, conll):
    texts = sst2[::20] + [" ".join(words) for words in conll[::5]]
    batch = tok(texts, return_offsets=True)
    checked = 0
    for text, ids, offsets in zip(texts, batch["input_ids"], batch["offset_mapping"]):
        assert len(offsets) == len(ids)
        for token_id, (start, end) in zip(ids, offsets):
            assert 0 <= start <= end <= len(text)
            if token_id in tok.special_ids:
                continue
            piece = tok.convert_ids_to_tokens(token_id).removeprefix("##")
            assert _fold(text[start:end]) == piece, (text, text[start:end], piece)
            checked += 1
    assert checked > 50_000


def test_minilm_tokenizer_json_equals_bare_vocab_txt(minilm, vocab_file, sst2):
    from_json = load_tokenizer(minilm)  # directory: prefers tokenizer.json
    from_vocab = load_tokenizer(vocab_file)
    from_minilm_vocab = load_tokenizer(minilm / "vocab.txt")
    assert from_json.name.endswith("tokenizer.json") and from_json.model_max_length == 512
    texts = sst2[:5000]
    ids = from_vocab(texts)["input_ids"]
    assert from_json(texts)["input_ids"] == ids  # MiniLM's baked-in pad-to-128 must not leak
    assert from_minilm_vocab(texts)["input_ids"] == ids
    assert from_json(texts[:-1], texts[1:], max_length=32)["input_ids"] == from_vocab(texts[:-1], texts[1:], max_length=32)["input_ids"]
    assert from_json.special_ids == from_vocab.special_ids == {0, 100, 101, 102, 103}


def test_save_round_trips_through_transformers(tok, vocab_dir, sst2, tmp_path):
    tok.save(tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == {"tokenizer.json", "vocab.txt", "tokenizer_config.json"}
    spec = json.loads((tmp_path / "tokenizer.json").read_text())
    assert spec["truncation"] is None and spec["padding"] is None
    assert (tmp_path / "vocab.txt").read_bytes() == (vocab_dir / "vocab.txt").read_bytes()
    texts = sst2[:3000] + ["[CLS] Unaffable Café, naïve [MASK]!", "中文 text", ""]
    reloaded_hf = transformers.BertTokenizerFast.from_pretrained(str(tmp_path))
    assert_same(tok(texts), reloaded_hf(texts))
    assert_same(tok(texts[:-1], texts[1:], max_length=24, padding=True),
                reloaded_hf(texts[:-1], texts[1:], max_length=24, truncation=True, padding=True))
    assert load_tokenizer(tmp_path)(texts)["input_ids"] == tok(texts)["input_ids"]


def test_tokenizer_config_is_respected(vocab_file, tmp_path):
    shutil.copy(vocab_file, tmp_path / "vocab.txt")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False, "model_max_length": 16}))
    cased = load_tokenizer(tmp_path)
    assert cased.model_max_length == 16
    ids = cased.encode("Hello hello")
    assert ids[1] == cased.unk_token_id and ids[2] == cased.convert_tokens_to_ids("hello")  # uncased vocab, cased input
    assert len(cased("word " * 100)["input_ids"]) == 16  # default max_length = model_max_length
    assert len(cased.encode("word " * 100)) == 102  # encode does not truncate unless asked


# ---------------------------------------------------------------------------------------------
# the API surface and the docstring's worked example

def test_api_basics(tok):
    assert (tok.pad_token_id, tok.unk_token_id, tok.cls_token_id, tok.sep_token_id, tok.mask_token_id) == (0, 100, 101, 102, 103)
    assert tok.vocab_size == len(tok.get_vocab()) == 30_522
    ids = tok.encode("Unaffable!")
    assert tok.convert_ids_to_tokens(ids) == ["[CLS]", "una", "##ffa", "##ble", "!", "[SEP]"]
    assert tok.convert_tokens_to_ids(["una", "no-such-token"]) == [14477, 100]
    assert tok.decode(ids) == "unaffable!"
    assert tok.decode(ids, skip_special_tokens=False) == "[CLS] unaffable! [SEP]"
    assert tok.encode("Unaffable!", add_special_tokens=False) == ids[1:-1]
    single = tok("a b", "c")
    assert single.input_ids == [101, 1037, 1038, 102, 1039, 102] and single.token_type_ids == [0, 0, 0, 0, 1, 1]
    assert single.tokens() == ["[CLS]", "a", "b", "[SEP]", "c", "[SEP]"]
    batch = tok(["a b c", "d"], padding="max_length", max_length=8, return_tensors="pt", return_offsets=True)
    assert batch["input_ids"].shape == (2, 8) and str(batch["input_ids"].dtype) == "torch.int64"
    assert batch["offset_mapping"].shape == (2, 8, 2)
    assert batch["attention_mask"].sum(1).tolist() == [5, 3]
    assert tok("one", return_tensors="pt")["input_ids"].shape == (1, 3)
    assert tok.batch_decode(batch["input_ids"]) == ["a b c", "d"]
    with pytest.raises(ValueError, match="padding=True"):
        tok(["a b c", "d"], return_tensors="pt")
    assert "WordPiece" in repr(tok)


def test_docstring_example_runs():
    assert doctest.testmod(tokmod).failed == 0
    toy = Tokenizer(build_wordpiece({"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "un": 4, "##aff": 5, "##able": 6}))
    assert toy.convert_ids_to_tokens(toy.encode("unaffable affable")) == ["[CLS]", "un", "##aff", "##able", "[UNK]", "[SEP]"]


# ---------------------------------------------------------------------------------------------
# errors name what is wrong and where

def test_missing_paths_raise_file_not_found(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match="nope.*tokenizer.json or vocab.txt"):
        load_tokenizer(missing)
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path)) + ".*neither tokenizer.json nor vocab.txt"):
        load_tokenizer(tmp_path)


def test_vocab_special_token_checks(vocab_file, tmp_path):
    tokens = vocab_file.read_text(encoding="utf-8").splitlines()
    no_mask = tmp_path / "no_mask.txt"
    no_mask.write_text("\n".join(t for t in tokens if t != "[MASK]") + "\n", encoding="utf-8")
    tok = load_tokenizer(no_mask)
    assert tok.mask_token_id is None and 103 not in tok.special_ids
    assert tok.convert_ids_to_tokens(tok.encode("hello")) == ["[CLS]", "hello", "[SEP]"]

    no_unk = tmp_path / "no_unk.txt"
    no_unk.write_text("\n".join(t for t in tokens if t != "[UNK]") + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"no_unk\.txt.*'\[UNK\]'"):
        load_tokenizer(no_unk)

    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(ValueError, match=r"empty\.txt.*empty"):
        load_tokenizer(empty)
