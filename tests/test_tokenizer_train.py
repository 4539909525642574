"""Tokenizer training (WordPiece, byte-level BPE, char) and GPT-2 vocabulary loading, against transformers."""
from __future__ import annotations

from pathlib import Path

import pytest

from attnlab.cli import main
from attnlab.tokenizers import build_char_tokenizer, load_tokenizer, train_tokenizer

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def books(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "gutenberg").glob("*.txt"))


@pytest.fixture(scope="module")
def small_text(tmp_path_factory, books) -> Path:
    """~300 kB of real text, so that training takes a fraction of a second."""
    path = tmp_path_factory.mktemp("text") / "sample.txt"
    path.write_text("".join(b.read_text(encoding="utf-8-sig")[20_000:40_000] for b in books), encoding="utf-8")
    return path


def test_gpt2_vocab_encodes_like_gpt2_tokenizer_fast(data_dir, books):
    gpt2 = data_dir / "vocab" / "gpt2"
    ours = load_tokenizer(gpt2)
    theirs = transformers.GPT2TokenizerFast(vocab=str(gpt2 / "encoder.json"), merges=str(gpt2 / "vocab.bpe"))
    assert ours.vocab_size == len(theirs) == 50257
    assert ours.convert_tokens_to_ids("<|endoftext|>") == 50256
    # every book's opening (licence header, BOM, odd punctuation) and one book in full
    texts = [b.read_text(encoding="utf-8")[:30_000] for b in books] + [books[-2].read_text(encoding="utf-8")]
    texts.append("Hello <|endoftext|> world  \n\n  trailing spaces\t tab, café, 日本語, emoji 🙂")
    for text in texts:
        ids = ours.encode(text)
        assert ids == theirs(text)["input_ids"]
        assert ours.decode(ids, skip_special_tokens=False) == text  # byte-level BPE is lossless


def test_wordpiece_training_writes_bert_files(tmp_path, small_text):
    tok = train_tokenizer("wordpiece", [small_text], vocab_size=1500)
    out = tok.save(tmp_path / "wp")
    assert {"vocab.txt", "tokenizer.json", "tokenizer_config.json"} <= {p.name for p in out.iterdir()}
    lines = (out / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert lines[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert 1000 < len(lines) <= 1500 and any(t.startswith("##") for t in lines)
    again = load_tokenizer(out)
    assert (again.pad_token_id, again.cls_token_id, again.sep_token_id, again.mask_token_id) == (0, 2, 3, 4)
    hf = transformers.BertTokenizerFast.from_pretrained(str(out))
    text = small_text.read_text(encoding="utf-8")[:5000]
    assert again.encode(text) == hf(text)["input_ids"]
    assert again.encode(text)[0] == 2 and again.encode(text)[-1] == 3


def test_bpe_training_writes_vocab_and_merges(tmp_path, small_text):
    tok = train_tokenizer("bpe", [small_text], vocab_size=800)
    out = tok.save(tmp_path / "bpe")
    assert {"tokenizer.json", "vocab.json", "merges.txt"} <= {p.name for p in out.iterdir()}
    again = load_tokenizer(out)
    assert again.vocab_size == 800 and again.special_tokens["eos_token"] == "<|endoftext|>"
    text = "Whatever the text, byte-level BPE never needs [UNK]: ünïcödé ✓\n"
    assert again.decode(again.encode(text), skip_special_tokens=False) == text
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(out / "tokenizer.json"))
    assert again.encode(text) == hf(text)["input_ids"]
    # the vocab.json + merges.txt pair alone loads too (the GPT-2 file layout)
    (out / "tokenizer.json").unlink()
    assert load_tokenizer(out).encode(text) == again.encode(text)


def test_char_tokenizer_is_nanogpt_vocabulary(data_dir):
    text_file = data_dir / "tiny_shakespeare" / "input.txt"
    tok = build_char_tokenizer([text_file])
    assert tok.vocab_size == 66  # 65 distinct characters + [UNK]
    assert tok.encode("\n !") == [0, 1, 2]  # sorted character order, as nanoGPT's prepare.py
    sample = text_file.read_text(encoding="utf-8")[:2000]
    assert tok.decode(tok.encode(sample)) == sample
    assert tok.encode("§") == [65]


def test_cli_train_and_errors(tmp_path, small_text, capsys):
    assert main(["tokenizer", "train", "--kind", "wordpiece", "--vocab-size", "600", "--output",
                 str(tmp_path / "cli"), str(small_text)]) == 0
    assert (tmp_path / "cli" / "vocab.txt").exists()
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert main(["tokenizer", "train", "--kind", "bpe", "--output", str(tmp_path / "x"), str(empty)]) == 1
    assert "empty" in capsys.readouterr().err
    with pytest.raises(ValueError, match="kind"):
        train_tokenizer("wordlevel", [small_text], 100)
