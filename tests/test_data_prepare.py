"""Corpus preparation: documents, sentences, shards, held-out split, resume, streams, bad input."""
from __future__ import annotations

import doctest
import json
from pathlib import Path

import numpy as np
import pytest

import attnlab.data.corpus as corpus_mod
from attnlab.cli import main
from attnlab.data import CorpusReader, open_shards, prepare_corpus
from attnlab.data.shards import token_dtype
from attnlab.data.stream import BatchStream, fixed_batches
from attnlab.objectives import ObjectiveConfig, build_objective
from attnlab.tokenizers import load_tokenizer

from _pretrain_utils import sample_text


@pytest.fixture(scope="module")
def bert_tok(data_dir: Path):
    return load_tokenizer(data_dir / "vocab" / "bert-base-uncased")


@pytest.fixture(scope="module")
def full_corpus(data_dir: Path, bert_tok, tmp_path_factory):
    """All 18 Gutenberg books + WikiText-2 valid, prepared once (~10 s)."""
    files = sorted((data_dir / "gutenberg").glob("*.txt")) + [data_dir / "wikitext-2" / "valid.txt"]
    out = tmp_path_factory.mktemp("corpus")
    stats = prepare_corpus(bert_tok, files, out, heldout=0.02, progress=False)
    return out, stats, files


def test_sentence_splitter_doctest():
    assert doctest.testmod(corpus_mod).failed == 0


def test_gutenberg_and_wikitext_prepare(full_corpus, bert_tok):
    out, stats, files = full_corpus
    meta = json.loads((out / "meta.json").read_text())
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == 30522
    assert stats.shards >= 2 and 2_000_000 < stats.train_tokens < 4_000_000
    # 18 books cut into chapters + 60 WikiText articles
    assert 600 < stats.documents < 1200
    assert 0.005 < stats.heldout_tokens / (stats.train_tokens + stats.heldout_tokens) < 0.05
    train, heldout = open_shards(out, "train"), open_shards(out, "heldout")
    assert sum(s.num_tokens for s in train) == stats.train_tokens
    assert sum(s.num_documents for s in heldout) == int(stats.documents * 0.02)  # every 50th document
    assert train[0].tokens.dtype == np.uint16 and isinstance(train[0].tokens, np.memmap)
    # the Project Gutenberg licence is gone: its words never appear in the token stream
    text = " ".join(bert_tok.decode(s.tokens[:200_000]) for s in train)
    assert "project gutenberg license" not in text and "start of the project gutenberg" not in text
    first = bert_tok.decode(train[0].document(0)[0])
    assert "gutenberg" not in first.lower() or "produced" in first.lower()
    # boundaries are consistent
    for s in train:
        assert s.sentences[0] == 0 and np.all(np.diff(s.sentences) > 0) and s.documents[-1] == len(s.sentences) - 1
    assert (out / "tokenizer" / "vocab.txt").exists()


def test_rerun_skips_finished_shards_and_resumes(full_corpus, bert_tok, tmp_path):
    out, stats, files = full_corpus
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("train-*.tokens")}
    again = prepare_corpus(bert_tok, files, out, heldout=0.02, progress=False)
    assert again.reused_shards == stats.shards and again.train_tokens == stats.train_tokens
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("train-*.tokens")} == before
    # an interrupted run: the last shard never got its marker; the re-run rebuilds exactly that one
    last = sorted(out.glob("shard-*.json"))[-1]
    index = int(last.stem.split("-")[1])
    reference = np.array(np.memmap(out / f"train-{index:05d}.tokens", dtype=np.uint16, mode="r"))
    last.unlink()
    (out / f"train-{index:05d}.tokens").unlink()
    resumed = prepare_corpus(bert_tok, files, out, heldout=0.02, progress=False)
    assert resumed.reused_shards == stats.shards - 1 and resumed.train_tokens == stats.train_tokens
    assert np.array_equal(np.memmap(out / f"train-{index:05d}.tokens", dtype=np.uint16, mode="r"), reference)
    with pytest.raises(ValueError, match="other settings"):
        prepare_corpus(bert_tok, files, out, heldout=0.1, progress=False)


def test_reader_streams_and_resumes_mid_file(data_dir):
    book = data_dir / "gutenberg" / "1400-0.txt"
    reader = CorpusReader([book])
    docs = iter(reader)
    first, second = next(docs), next(docs)  # lazily: only the first chapters were read
    assert first.end.byte_offset < book.stat().st_size / 5
    again = next(reader.read(first.end))
    assert again.sentences == second.sentences


def test_token_dtype_widens_for_big_vocabularies():
    assert token_dtype(30522) == np.uint16 and token_dtype(65536) == np.uint16
    assert token_dtype(65537) == np.uint32 and token_dtype(151_000) == np.uint32


def test_raw_tail_split_for_character_models(data_dir, tmp_path):
    from attnlab.tokenizers import build_char_tokenizer
    text = data_dir / "tiny_shakespeare" / "input.txt"
    tok = build_char_tokenizer([text])
    stats = prepare_corpus(tok, [text], tmp_path, documents="file", raw=True, heldout=0.1, heldout_mode="tail",
                           progress=False)
    assert stats.train_tokens + stats.heldout_tokens == 1_115_394  # every character, newlines included
    heldout = open_shards(tmp_path, "heldout")[0]
    tail = text.read_text(encoding="utf-8")[-stats.heldout_tokens:]
    assert tok.decode(heldout.tokens) == tail


def test_bad_input_messages(bert_tok, tmp_path, capsys):
    good = tmp_path / "good.txt"
    good.write_text("One sentence here. Another one there.\n\nA new paragraph.\n")
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("Fine first line.\n".encode() + "caf\xe9 in Latin-1\n".encode("latin-1") + b"Fine again.\n")

    # empty files alone: nothing to train on, said plainly
    with pytest.raises(ValueError, match="no text found.*empty files: .*empty.txt"):
        prepare_corpus(bert_tok, [empty], tmp_path / "o1", progress=False)
    # an empty file among others is fine
    assert prepare_corpus(bert_tok, [empty, good], tmp_path / "o2", heldout=0, progress=False).train_tokens > 0
    # invalid UTF-8: skipped and counted by default, or an error naming file and byte offset
    stats = prepare_corpus(bert_tok, [bad], tmp_path / "o3", heldout=0, progress=False)
    assert stats.skipped_lines == 1 and stats.train_tokens > 0
    with pytest.raises(ValueError, match=r"latin1.txt: invalid UTF-8 at byte offset 20"):
        prepare_corpus(bert_tok, [bad], tmp_path / "o4", on_bad_utf8="error", progress=False)
    assert main(["prepare", "--tokenizer", str(tmp_path / "o3" / "tokenizer"), "--output", str(tmp_path / "o5"),
                 "--heldout", "0", "--no-progress", str(bad)]) == 0
    assert "skipped 1 line(s)" in capsys.readouterr().err
    assert main(["prepare", "--tokenizer", str(tmp_path / "o3" / "tokenizer"), "--output", str(tmp_path / "o6"),
                 "--on-bad-utf8", "error", "--no-progress", str(bad)]) == 1
    assert "byte offset 20" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        prepare_corpus(bert_tok, [tmp_path / "nope.txt"], tmp_path / "o7", progress=False)

    # a corpus smaller than one training sequence
    objective = build_objective(ObjectiveConfig(kind="mlm"), bert_tok, 128)
    stream = BatchStream(open_shards(tmp_path / "o2"), objective.examples, objective.collate, 4)
    with pytest.raises(ValueError, match="smaller than one training sequence"):
        next(stream)
    with pytest.raises(ValueError, match="cannot be dealt to 2 data slices"):
        BatchStream(open_shards(tmp_path / "o2"), objective.examples, objective.collate, 4, num_slices=2)
    with pytest.raises(FileNotFoundError, match="prepare the corpus first"):
        open_shards(tmp_path / "nothing")


def test_stream_is_resumable_and_sliced(data_dir, tmp_path):
    from attnlab.tokenizers import train_tokenizer
    text = sample_text(data_dir, tmp_path / "text", chars_per_book=5000)
    tok = train_tokenizer("wordpiece", sorted(text.iterdir()), 800)
    prepare_corpus(tok, sorted(text.iterdir()), tmp_path / "c", shard_tokens=2000, progress=False)
    shards = open_shards(tmp_path / "c")
    assert len(shards) >= 4
    obj = build_objective(ObjectiveConfig(kind="mlm"), tok, 32)
    a = BatchStream(shards, obj.examples, obj.collate, 8, seed=3, num_slices=2)
    batches = [next(a) for _ in range(60)]  # crosses epochs: 30 x 8 blocks of 32 tokens per slice
    assert a.epoch() >= 1
    b = BatchStream(shards, obj.examples, obj.collate, 8, seed=3, num_slices=2)
    for _ in range(17):
        next(b)
    c = BatchStream(shards, obj.examples, obj.collate, 8, seed=3, num_slices=2)
    c.load_state_dict(json.loads(json.dumps(b.state_dict())))
    for want in batches[17:]:
        got = next(c)
        assert all(np.array_equal(want[k], got[k]) for k in want)
    # rank r of 2 sees exactly the micro-batches of slice r: the even / odd batches of one process
    r1 = BatchStream(shards, obj.examples, obj.collate, 8, seed=3, num_slices=2, owned=[1])
    for want in batches[1::2][:5]:
        assert np.array_equal(next(r1)["input_ids"], want["input_ids"])
    evals = fixed_batches(shards, obj.examples, obj.collate, 8, max_batches=3)
    assert len(evals) == 3
    assert np.array_equal(evals[0]["labels"], fixed_batches(shards, obj.examples, obj.collate, 8)[0]["labels"])
