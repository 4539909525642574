"""SentencePiece Unigram: .model files read without sentencepiece, ids and decoding equal to the sentencepiece
library on every Multi30k line; T5 / ALBERT / XLNet / XLM-R layouts equal to transformers; training."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnlab.cli import main
from attnlab.tokenizer_unigram import (BYTE, CONTROL, NORMAL, UNKNOWN, USER_DEFINED, Piece, SentencePieceModel,
                                       build_unigram, read_model, write_model)
from attnlab.tokenizers import load_tokenizer, train_tokenizer

# sentencepiece is the oracle (a `test` extra, as transformers); a user's clone without the extras skips
spm = pytest.importorskip("sentencepiece", reason="sentencepiece (the oracle) is not installed: pip install -e .[test]")

ODD = ["", "   ", "  Two  dogs\t run . ", "ｆｕｌｌｗｉｄｔｈ ＡＢＣ ①", "emoji 🦜 and 中文", "<sep> a [MASK] b",
       "x\u00a0y", "a\u3000b  ", "Café naïve ﬁ", "5 dogs", "\u2581lead"]


@pytest.fixture(scope="module")
def multi30k(data_dir: Path) -> tuple[list[str], str]:
    files = [data_dir / "multi30k" / f for f in ("train.en", "train.de", "val.en", "val.de")]
    lines = [line.rstrip("\n") for f in files for line in f.read_text(encoding="utf-8").splitlines()]
    assert len(lines) == 2 * (29_000 + 1_014)
    return lines, ",".join(map(str, files))


def _train_spm(tmp: Path, name: str, input: str, **options) -> Path:
    spm.SentencePieceTrainer.train(input=input, model_prefix=str(tmp / name), model_type="unigram", num_threads=1,
                                   minloglevel=2, **options)
    return tmp / f"{name}.model"


@pytest.mark.slow
@pytest.mark.parametrize("options", [
    dict(vocab_size=1000, user_defined_symbols=["<sep>", "[MASK]"], control_symbols=["<cls>"], pad_id=3),
    dict(vocab_size=8000, byte_fallback=True)], ids=["1k-user-defined", "8k-byte-fallback"])
def test_ids_and_decoding_equal_sentencepiece_on_every_multi30k_line(tmp_path, multi30k, options):
    lines, files = multi30k
    path = _train_spm(tmp_path, "m", files, **options)
    sp = spm.SentencePieceProcessor(model_file=str(path))
    tok = build_unigram(read_model(path))
    texts = lines + ODD
    ours = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    theirs = sp.encode(texts)
    assert sum(a != b for a, b in zip(ours, theirs)) == 0
    assert [tok.decode(ids) for ids in theirs] == sp.decode(theirs)
    if options.get("byte_fallback"):  # the odd lines' unknown characters come back as bytes, not <unk>
        assert sp.unk_id() not in {i for ids in theirs for i in ids}
    else:
        assert sp.unk_id() in set(theirs[len(lines) + ODD.index("emoji 🦜 and 中文")])  # "emoji 🦜 and 中文": unknowns decode as " ⁇ ", as sentencepiece


@pytest.fixture(scope="module")
def small_input(tmp_path_factory, multi30k) -> str:
    lines, _ = multi30k
    path = tmp_path_factory.mktemp("text") / "small.txt"
    path.write_text("\n".join(lines[:3000] + lines[29_000:30_000]) + "\n", encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("options", [
    dict(normalization_rule_name="identity"), dict(add_dummy_prefix=False),
    dict(remove_extra_whitespaces=False), dict(normalization_rule_name="nfkc_cf")])
def test_normalizer_settings_follow_the_model(tmp_path, small_input, multi30k, options):
    path = _train_spm(tmp_path, "m", small_input, vocab_size=500, **options)
    sp = spm.SentencePieceProcessor(model_file=str(path))
    model = read_model(path)
    assert (model.add_dummy_prefix, model.remove_extra_whitespaces) == (
        options.get("add_dummy_prefix", True), options.get("remove_extra_whitespaces", True))
    tok = build_unigram(model)
    texts = multi30k[0][-500:] + ODD
    theirs = sp.encode(texts)
    assert [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)] == theirs
    assert [tok.decode(ids) for ids in theirs] == sp.decode(theirs)


def test_random_unicode_encodes_as_sentencepiece(tmp_path_factory, small_input):
    """Random text from every script; left out: combining marks and Hangul jamo, which the Rust charsmap
    lookup groups by grapheme, and typed control pieces (see build_unigram). "<unk>", "<0x41>" stay in."""
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    path = _train_spm(tmp_path_factory.mktemp("fuzz"), "m", small_input, vocab_size=500, byte_fallback=True)
    sp, tok = spm.SentencePieceProcessor(model_file=str(path)), build_unigram(read_model(path))
    jamo = "".join(map(chr, [*range(0x1100, 0x1200), *range(0x3130, 0x3190), *range(0xA960, 0xA980),
                             *range(0xD7B0, 0xD800)]))
    chars = st.characters(blacklist_categories=("Cs", "Mn", "Mc", "Me"), blacklist_characters=jamo)

    @hypothesis.settings(max_examples=300, deadline=None, derandomize=True)
    @hypothesis.given(st.text(chars, max_size=40) | st.text("ab äöüß\t\n\u00a0\u3000ﬁ①Ⅻ ", max_size=20))
    def check(text):
        hypothesis.assume(not any(t in text for t in ("<s>", "</s>")))  # control pieces: see build_unigram
        ids = sp.encode(text)
        assert tok.encode(text, add_special_tokens=False).ids == ids
        assert tok.decode(ids) == sp.decode(ids)
    check()


def test_protobuf_round_trip_and_sentencepiece_loads_what_we_write(tmp_path):
    pieces = [Piece("<unk>", 0, UNKNOWN), Piece("<s>", 0, CONTROL), Piece("</s>", 0, CONTROL),
              Piece("<sep>", 0, USER_DEFINED), Piece("\u2581", -2.0), Piece("\u2581a", -3.0), Piece("b", -2.5),
              Piece("\u2581ab", -4.0), Piece("a", -3.5), *[Piece(f"<0x{i:02X}>", 0, BYTE) for i in range(256)]]
    model = SentencePieceModel(pieces, byte_fallback=True, trainer={"unk_id": 0, "bos_id": 1, "eos_id": 2, "pad_id": -1})
    back = read_model(write_model(model, tmp_path / "tiny.model"))
    assert [(p.piece, p.score, p.type) for p in back.pieces] == [(p.piece, p.score, p.type) for p in pieces]
    assert back.byte_fallback and back.trainer["pad_id"] == 2**64 - 1  # int32 -1 on the wire
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "tiny.model"))
    text = ["ab a<sep>b", "abé"]  # "▁ab" beats "▁a"+"b"; <sep> is user-defined; é falls back to bytes
    assert [e.ids for e in build_unigram(back).encode_batch(text, add_special_tokens=False)] == sp.encode(text)
    assert sp.encode(text)[0] == [7, 5, 3, 6]


def test_bad_model_files_name_the_problem(tmp_path):
    (tmp_path / "junk.model").write_bytes(b"\xff\xff\xff")
    with pytest.raises(ValueError, match=r"junk\.model: not a sentencepiece model file"):
        read_model(tmp_path / "junk.model")
    bpe = tmp_path / "bpe"
    spm.SentencePieceTrainer.train(sentence_iterator=iter(["a b c ab abc"] * 50), model_prefix=str(bpe),
                                   model_type="bpe", vocab_size=10, minloglevel=2, num_threads=1)
    with pytest.raises(ValueError, match=r"bpe\.model: a sentencepiece BPE model.*only Unigram"):
        load_tokenizer(tmp_path / "bpe.model")


# transformers builds each family's fast tokenizer from the same .model (its converter needs protobuf)
LAYOUTS = {
    "t5": ("spiece.model", {"tokenizer_class": "T5Tokenizer"}, dict(pad_id=0, eos_id=1, unk_id=2, bos_id=-1)),
    "albert": ("spiece.model", {"tokenizer_class": "AlbertTokenizer"},
               dict(pad_id=0, unk_id=1, bos_id=-1, eos_id=-1, control_symbols=["[CLS]", "[SEP]"],
                    user_defined_symbols=["[MASK]"])),
    "xlnet": ("spiece.model", {"tokenizer_class": "XLNetTokenizer"},
              dict(control_symbols=["<cls>", "<sep>", "<pad>", "<mask>", "<eod>"], user_defined_symbols=["<eop>"])),
    "xlm-roberta": ("sentencepiece.bpe.model", None, {}),  # found by file name and config.json's model_type
}


@pytest.mark.parametrize("family", list(LAYOUTS))
def test_checkpoint_layouts_equal_transformers(tmp_path, small_input, multi30k, family):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("google.protobuf", reason="transformers converts .model files with protobuf (test extra)")
    name, tokenizer_config, options = LAYOUTS[family]
    _train_spm(tmp_path, "m", small_input, vocab_size=800, **options).rename(tmp_path / name)
    if tokenizer_config:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    else:
        (tmp_path / "config.json").write_text(json.dumps({"model_type": "xlm-roberta"}))
    ours, theirs = load_tokenizer(tmp_path), transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert ours.vocab_size == len(theirs)
    for role, token in ours.special_tokens.items():
        assert getattr(theirs, role) == token and ours.convert_tokens_to_ids(token) == getattr(theirs, f"{role}_id")
    lines = multi30k[0][-1000:]
    a, b = ours(lines[:500], lines[500:]), theirs(lines[:500], lines[500:])
    assert a["input_ids"] == b["input_ids"]
    if "token_type_ids" in b:  # T5's tokenizer returns none
        assert a["token_type_ids"] == b["token_type_ids"]
    assert ours(lines)["input_ids"] == theirs(lines)["input_ids"]
    if family == "t5":  # 100 sentinels after the pieces, <extra_id_0> the very last id
        assert ours.convert_tokens_to_ids("<extra_id_0>") == len(theirs) - 1 == theirs.convert_tokens_to_ids("<extra_id_0>")
    if family == "xlm-roberta":  # fairseq's offset: sentencepiece's id + 1 for every ordinary piece
        sp = spm.SentencePieceProcessor(model_file=str(tmp_path / name))
        assert ours.encode(lines[0], add_special_tokens=False) == [i + 1 for i in sp.encode(lines[0])]
    # decoding drops the specials; only <unk> differs from transformers (sentencepiece writes " ⁇ " for it)
    known = [ids for ids in b["input_ids"] if ours.unk_token_id not in ids]
    assert ours.batch_decode(known) == theirs.batch_decode(known, skip_special_tokens=True)


def test_trained_unigram_saves_loads_back_in_ours_sentencepiece_and_transformers(tmp_path, small_input, multi30k):
    tok = train_tokenizer("unigram", [small_input], 600)
    assert tok.vocab_size == 600 and tok.convert_ids_to_tokens([0, 1, 2, 3]) == ["<unk>", "<s>", "</s>", "<pad>"]
    assert tok.pad_token_id == 3 and tok.unk_token_id == 0
    lines = multi30k[0][-300:] + ODD[2:]
    ids = tok(lines, truncation=False)["input_ids"]
    assert all(not any(p.count("\u2581") > 1 or "\u2581" in p[1:] for p in tok.convert_ids_to_tokens(x)) for x in ids)
    tok.save(tmp_path / "tok")
    assert load_tokenizer(tmp_path / "tok")(lines, truncation=False)["input_ids"] == ids
    assert spm.SentencePieceProcessor(model_file=str(tmp_path / "tok" / "spiece.model")).encode(lines) == ids
    transformers = pytest.importorskip("transformers")
    assert transformers.AutoTokenizer.from_pretrained(str(tmp_path / "tok"))(lines)["input_ids"] == ids
    assert load_tokenizer(tmp_path / "tok" / "spiece.model")(lines, truncation=False)["input_ids"] == ids


def test_cli_trains_a_unigram_tokenizer(tmp_path, small_input, capsys):
    out = tmp_path / "tok"
    assert main(["tokenizer", "train", "--kind", "unigram", "--vocab-size", "400", "--output", str(out), small_input]) == 0
    assert "unigram tokenizer with 400 tokens" in capsys.readouterr().out
    assert (out / "spiece.model").is_file() and load_tokenizer(out).vocab_size == 400
