"""Tokenizers: text -> token ids -> text, on top of the Rust `tokenizers` library.

This module builds, trains and reads tokenizers (WordPiece, byte-level BPE, Unigram, bytes, characters);
the `Tokenizer` they all return, with its call API, is `attnlab/tokenizer_core.py` (re-exported here).

How BERT's WordPiece turns text into ids, by hand, with a toy vocab
{"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "un": 4, "##aff": 5, "##able": 6, "!": 7}:

  1. normalize      "Unaffable!"  ->  "unaffable!"     lower-case, strip accents, clean control chars
  2. pre-tokenize   -> ["unaffable", "!"]                split on whitespace and around punctuation
  3. WordPiece      per word, greedy longest-match-first from the left; pieces after the first one
                    carry the "##" prefix meaning "glued to the previous piece":
                      "unaffable": longest vocab prefix is "un"; rest "affable" -> "##aff"; rest "##able"
                      -> ["un", "##aff", "##able"]      (no match at some point -> the whole word is [UNK])
  4. post-process   [CLS] un ##aff ##able ! [SEP]      -> ids [2, 4, 5, 6, 7, 3]
                    a pair is [CLS] A [SEP] B [SEP], token_type_ids 0 for "[CLS] A [SEP]", 1 for "B [SEP]"

    >>> tok = Tokenizer(build_wordpiece({"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3,
    ...                                  "un": 4, "##aff": 5, "##able": 6, "!": 7}))
    >>> tok.convert_ids_to_tokens(tok.encode("Unaffable!"))
    ['[CLS]', 'un', '##aff', '##able', '!', '[SEP]']
    >>> tok.decode(tok.encode("Unaffable!"))
    'unaffable!'

Greedy matching depends on the vocab: the real bert-base-uncased vocab has no "##aff", so it
splits the same word as ["una", "##ffa", "##ble"].

Usage:
    tok = load_tokenizer("path/to/model_dir")       # tokenizer.json, or vocab.txt (+ tokenizer_config.json)
    batch = tok(["a sentence", "another"], padding=True, return_tensors="pt")
    batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]
    tok.save("out_dir")                              # loadable by transformers' from_pretrained too
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Sequence

import tokenizers as tk

from . import tokenizer_unigram as unigram
from .tokenizer_core import BERT_SPECIALS, DEFAULT_MAX_LENGTH, Encoding, Tokenizer

__all__ = ["Tokenizer", "Encoding", "load_tokenizer", "build_wordpiece", "read_vocab", "build_byte_level_bpe",
           "read_gpt2_files", "build_char_tokenizer", "train_tokenizer"]

REQUIRED_WORDPIECE = ("unk_token", "cls_token", "sep_token", "pad_token")  # [MASK] only matters for MLM
_UNSET_MAX_LENGTH = 1_000_000  # transformers writes ~1e30 to mean "no limit"; treat as unset
# GPT-2's one special token plays every role it has (begin/end of text, unknown).
GPT2_SPECIALS = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}
# RoBERTa and BART keep GPT-2's byte-level BPE but fairseq's specials (<s>=0 <pad>=1 </s>=2 <unk>=3 ...
# <mask> last): a sequence is "<s> A </s>", a pair "<s> A </s></s> B </s>" (Liu et al. 2019; Lewis et al. 2019)
FAIRSEQ_SPECIALS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
                    "mask_token": "<mask>", "cls_token": "<s>", "sep_token": "</s>"}
ROLES = (*BERT_SPECIALS, "bos_token", "eos_token")


# ----------------------------------------------------------------------------------------------
# Building / loading

def read_vocab(path: str | Path) -> dict[str, int]:
    """vocab.txt -> {token: line number}. One token per line, as BERT ships it."""
    path = Path(path)
    lines = path.read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the file's final newline is not an empty token
    # Strip "\r" too: a vocab saved with CRLF endings would otherwise glue "\r" onto every token.
    vocab = {line.rstrip("\r"): i for i, line in enumerate(lines)}  # duplicates: last wins, as in BERT
    if not vocab:
        raise ValueError(f"vocab file {path} is empty (expected one token per line)")
    return vocab


def _check_specials(vocab: dict[str, int], specials: dict[str, str], source: Any) -> None:
    for role in REQUIRED_WORDPIECE:
        if specials[role] not in vocab:
            raise ValueError(f"{source}: vocab has no {specials[role]!r} token (needed as {role}); "
                             f"a BERT WordPiece vocab must contain "
                             f"{', '.join(specials[r] for r in REQUIRED_WORDPIECE)}")


def build_wordpiece(vocab: dict[str, int], *, lowercase: bool = True, strip_accents: bool | None = None,
                    chinese_chars: bool = True, specials: dict[str, str] | None = None,
                    source: Any = "<vocab>") -> tk.Tokenizer:
    """The BERT pipeline (normalizer, pre-tokenizer, WordPiece, [CLS]/[SEP] template) for `vocab`."""
    specials = {**BERT_SPECIALS, **(specials or {})}
    _check_specials(vocab, specials, source)
    unk, cls, sep = specials["unk_token"], specials["cls_token"], specials["sep_token"]
    backend = tk.Tokenizer(tk.models.WordPiece(vocab, unk_token=unk, continuing_subword_prefix="##",
                                               max_input_chars_per_word=100))
    # strip_accents=None means "follow lowercase", exactly as original BERT's uncased/cased models.
    backend.normalizer = tk.normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=chinese_chars,
                                                       strip_accents=strip_accents, lowercase=lowercase)
    backend.pre_tokenizer = tk.pre_tokenizers.BertPreTokenizer()
    backend.decoder = tk.decoders.WordPiece(prefix="##", cleanup=True)
    backend.post_processor = tk.processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])])
    # Registering specials keeps "[SEP]" typed in the text as one token and lets decode skip them;
    # normalized=False so lower-casing cannot turn "[CLS]" into "[cls]" before matching.
    backend.add_special_tokens([tk.AddedToken(t, special=True, normalized=False)
                                for t in specials.values() if t in vocab])
    return backend


def _read_json(path: Path) -> dict:
    """A JSON object from `path` ({} when there is no such file); anything else is a ValueError naming it."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise ValueError(f"{path}: not valid JSON ({type(err).__name__}: {_first_line(err):.200})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _settings(folder: Path) -> dict:
    """special_tokens_map.json overlaid by tokenizer_config.json; each role checked in the file it came from."""
    config: dict = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        data = _read_json(folder / name)
        for role in ROLES:
            value = data.get(role)
            if value and not isinstance(value, str) and not (isinstance(value, dict)
                                                             and isinstance(value.get("content"), str)):
                raise ValueError(f"{folder / name}: {role}={value!r:.60} is neither a token nor "
                                 "{\"content\": token}")
        config.update(data)
    return config


def _token_str(value: Any) -> str:
    # transformers stores special tokens either as "[CLS]" or as {"content": "[CLS]", ...}
    return value["content"] if isinstance(value, dict) else str(value)


def _is_panic(err: BaseException) -> bool:
    # the Rust library's panics surface as pyo3's PanicException, a BaseException (not an Exception)
    return type(err).__name__ == "PanicException"


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load from a model directory, a tokenizer.json file, a vocab.txt file, or a sentencepiece .model file.

    A directory prefers tokenizer.json over vocab.txt over spiece.model / sentencepiece.bpe.model (T5,
    ALBERT, XLNet, XLM-R: their specials from tokenizer_config.json's tokenizer_class or config.json's
    model_type; anything else gets sentencepiece's ids unchanged). Settings (special tokens, do_lower_case,
    strip_accents, tokenize_chinese_chars, model_max_length) come from tokenizer_config.json /
    special_tokens_map.json next to the file, with BERT defaults otherwise. Files that cannot describe a
    tokenizer are a ValueError naming the file.
    """
    try:
        return _load_tokenizer(path)
    except OSError:
        raise
    except BaseException as err:
        if not isinstance(err, Exception) and not _is_panic(err):
            raise  # KeyboardInterrupt, SystemExit
        folder = Path(path) if Path(path).is_dir() else Path(path).parent
        if isinstance(err, ValueError) and str(folder) in str(err):
            raise  # already names the file at fault
        raise ValueError(f"{path}: cannot build a tokenizer from these files ({type(err).__name__}: "
                         f"{_first_line(err):.200})") from None


def _load_tokenizer(path: str | Path) -> Tokenizer:
    """`load_tokenizer` without the error wrapping."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"tokenizer path {path} does not exist (expected a directory holding "
                                f"tokenizer.json or vocab.txt, or the path of one of those files)")
    folder = path if path.is_dir() else path.parent
    if path.is_dir():
        found = [path / name for name in ("tokenizer.json", "vocab.txt", *unigram.MODEL_FILES)
                 if (path / name).is_file()]
        if not found and read_gpt2_files(path) is not None:  # GPT-2 files: encoder.json + vocab.bpe
            vocab, merges = read_gpt2_files(path)
            if all(t in vocab for t in ("<s>", "</s>", "<pad>", "<mask>")):  # RoBERTa / BART vocab.json
                return _fairseq_bpe(vocab, merges, path)
            return Tokenizer(build_byte_level_bpe(vocab, merges), specials=dict(GPT2_SPECIALS),
                             model_max_length=1024, name=str(path))
        if not found:
            raise FileNotFoundError(f"directory {path} holds neither tokenizer.json nor vocab.txt nor spiece.model "
                                    f"(nor GPT-2's encoder.json + vocab.bpe)")
        path = found[0]
    config = _settings(folder)
    max_length = config.get("model_max_length")
    if not isinstance(max_length, int) or max_length >= _UNSET_MAX_LENGTH:
        # BERT-style configs know their position budget; RoBERTa-style ones (514) must set
        # model_max_length in tokenizer_config.json instead.
        max_length = _read_json(folder / "config.json").get("max_position_embeddings", DEFAULT_MAX_LENGTH)

    if path.suffix == ".model":  # a sentencepiece model (T5, ALBERT, XLNet, XLM-R, or one of our own)
        return _sentencepiece(path, config, folder)
    backend = _from_file(path) if path.suffix == ".json" else None
    wordpiece = backend is None or isinstance(backend.model, tk.models.WordPiece)
    specials = dict(BERT_SPECIALS) if wordpiece else {}  # BPE defaults will differ
    if not wordpiece and all(t in backend.get_vocab() for t in ("<s>", "</s>", "<pad>", "<mask>")):
        specials = dict(FAIRSEQ_SPECIALS)  # a RoBERTa / BART tokenizer.json without tokenizer_config.json
    specials.update({role: _token_str(config[role]) for role in ROLES if config.get(role)})
    if backend is not None:
        if wordpiece:
            _check_specials(backend.get_vocab(), specials, path)
    else:
        backend = build_wordpiece(read_vocab(path), lowercase=config.get("do_lower_case", True),
                                  strip_accents=config.get("strip_accents"),
                                  chinese_chars=config.get("tokenize_chinese_chars", True),
                                  specials=specials, source=path)
    tok = Tokenizer(backend, specials=specials, model_max_length=int(max_length), name=str(path))
    tok.chat_template = config.get("chat_template")  # a Jinja2 string for chat models (inference/chat.py)
    return tok


def _from_file(path: Path) -> tk.Tokenizer:
    try:
        return tk.Tokenizer.from_file(str(path))
    except BaseException as err:  # the Rust parser's errors (and panics) name no file
        if not isinstance(err, Exception) and not _is_panic(err):
            raise
        raise ValueError(f"{path}: not a tokenizer.json the tokenizers library can read "
                         f"({_first_line(err):.200})") from None


def _sentencepiece(path: Path, config: dict, folder: Path) -> Tokenizer:
    """A sentencepiece Unigram `.model` with the specials of the family named by the files beside it."""
    family = unigram.sentencepiece_family(path, config, _read_json(folder / "config.json").get("model_type"))
    return _unigram_tokenizer(unigram.read_model(path), family, config, str(path))


def _unigram_tokenizer(model: unigram.SentencePieceModel, family: str, config: dict, name: str) -> Tokenizer:
    backend, specials, max_length = unigram.build_family(model, family, config)
    tok = Tokenizer(backend, specials=specials, model_max_length=max_length, name=name)
    tok.sentencepiece = model if family == "sentencepiece" else None  # save() writes it back as spiece.model
    return tok


# ----------------------------------------------------------------------------------------------
# Byte-level BPE (GPT-2), character level, and training new vocabularies

def read_gpt2_files(directory: str | Path) -> tuple[dict[str, int], list[tuple[str, str]]] | None:
    """(vocab, merges) from GPT-2's encoder.json + vocab.bpe (or vocab.json + merges.txt); None if absent."""
    directory = Path(directory)
    for vocab_name, merges_name in (("encoder.json", "vocab.bpe"), ("vocab.json", "merges.txt")):
        if (directory / vocab_name).is_file() and (directory / merges_name).is_file():
            vocab = _read_json(directory / vocab_name)
            lines = (directory / merges_name).read_text(encoding="utf-8").splitlines()
            # the first line is "#version: 0.2"; each other line is one merge "a b", best first
            merges = [tuple(line.split(" ")) for line in lines if line and not line.startswith("#version")]
            bad = next((m for m in merges if len(m) != 2), None)
            if bad is not None:
                raise ValueError(f"{directory / merges_name}: a merge line must hold two tokens, got {' '.join(bad)!r}")
            return vocab, merges
    return None


def build_byte_level_bpe(vocab: dict[str, int], merges: list[tuple[str, str]],
                         specials: Iterable[str] = ("<|endoftext|>",)) -> tk.Tokenizer:
    """GPT-2's pipeline: text -> UTF-8 bytes shown as printable characters (a space becomes "Ġ") ->
    GPT-2's regex pre-split -> BPE merges in rank order; no [CLS]/[SEP] around the ids."""
    backend = tk.Tokenizer(tk.models.BPE(vocab, merges, fuse_unk=False))
    backend.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = tk.decoders.ByteLevel()
    backend.post_processor = tk.processors.ByteLevel(trim_offsets=False)
    backend.add_special_tokens([tk.AddedToken(t, special=True, normalized=False) for t in specials if t in vocab])
    return backend


def _fairseq_bpe(vocab: dict[str, int], merges: list[tuple[str, str]], directory: Path) -> "Tokenizer":
    """A RoBERTa / BART directory's vocab.json + merges.txt with their special tokens; roles renamed in
    tokenizer_config.json / special_tokens_map.json win, as in transformers."""
    config = _settings(directory)
    specials = {**FAIRSEQ_SPECIALS, **{role: _token_str(config[role]) for role in ROLES if config.get(role)}}
    absent = next((f"{specials[r]!r} ({r})" for r in FAIRSEQ_SPECIALS if specials[r] not in vocab), None)
    if absent:
        raise ValueError(f"{directory / 'vocab.json'}: no token {absent}, a special token RoBERTa/BART need")
    backend = build_byte_level_bpe(vocab, merges, specials=[specials[r] for r in ("bos_token", "pad_token",
                                                                                  "eos_token", "unk_token")])
    # "<mask>" swallows the space before it, so "a <mask> b" masks the word " b" would have been (HF's lstrip)
    backend.add_special_tokens([tk.AddedToken(specials["mask_token"], special=True, normalized=False, lstrip=True)])
    cls, sep = specials["cls_token"], specials["sep_token"]
    backend.post_processor = tk.processors.RobertaProcessing((sep, vocab[sep]), (cls, vocab[cls]),
                                                             trim_offsets=True, add_prefix_space=False)
    max_length = config.get("model_max_length")
    if not isinstance(max_length, int) or max_length >= _UNSET_MAX_LENGTH:
        max_length = _read_json(directory / "config.json").get("max_position_embeddings") or 1024
    return Tokenizer(backend, specials=specials, model_max_length=int(max_length), name=str(directory))


def byte_chars() -> list[str]:
    """The printable character ByteLevel pre-tokenization shows for each byte 0..255 (GPT-2's table):
    printable Latin-1 bytes stand for themselves, the other 68 are shifted to code points 256 upward."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(shifted)) for b in range(256)]


def build_byte_tokenizer(extra_ids: int = 125, model_max_length: int = 1024) -> Tokenizer:
    """ByT5's tokenizer (Xue et al. 2022, §3.1): one token per UTF-8 byte, id = byte + 3 after <pad>=0,
    </s>=1, <unk>=2; `extra_ids` sentinels <extra_id_0>, ... from 259 on; "</s>" ends every sequence.
    No vocabulary to learn and nothing out of vocabulary. Built on a merge-free byte-level BPE, so padding,
    truncation, offsets and saving are the wrapper's own (ids equal transformers' ByT5Tokenizer())."""
    specials = ["<pad>", "</s>", "<unk>"]
    vocab = {t: i for i, t in enumerate(specials)}
    vocab.update({c: b + len(specials) for b, c in enumerate(byte_chars())})
    sentinels = [f"<extra_id_{i}>" for i in range(extra_ids)]
    vocab.update({t: 259 + i for i, t in enumerate(sentinels)})
    backend = tk.Tokenizer(tk.models.BPE(vocab, [], fuse_unk=False))
    # no regex pre-split: with no merges every byte is its own token anyway
    backend.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = tk.decoders.ByteLevel()
    # ByT5's <pad>, </s>, <unk> swallow the spaces around them when they occur in text (lstrip/rstrip)
    backend.add_special_tokens([tk.AddedToken(t, special=True, normalized=False, lstrip=True, rstrip=True)
                                for t in specials] +
                               [tk.AddedToken(t, special=True, normalized=False) for t in sentinels])
    backend.post_processor = tk.processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                              special_tokens=[("</s>", 1)])
    return Tokenizer(backend, specials={"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"},
                     model_max_length=model_max_length, name="byte")


def build_char_tokenizer(files: Iterable[str | Path], unk: str = "[UNK]") -> Tokenizer:
    """One token per character seen in `files`, ids in sorted character order (nanoGPT's shakespeare_char
    vocabulary), plus an unknown token at the end."""
    chars: set[str] = set()
    for f in files:
        with open(f, encoding="utf-8") as fh:
            for line in fh:
                chars.update(line)
    if not chars:
        raise ValueError("character tokenizer: the input files hold no text")
    vocab = {c: i for i, c in enumerate(sorted(chars))}
    vocab[unk] = len(vocab)
    backend = tk.Tokenizer(tk.models.WordLevel(vocab, unk_token=unk))
    backend.pre_tokenizer = tk.pre_tokenizers.Split(tk.Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = tk.decoders.Fuse()
    backend.add_special_tokens([tk.AddedToken(unk, special=True, normalized=False)])
    return Tokenizer(backend, specials={"unk_token": unk}, model_max_length=DEFAULT_MAX_LENGTH, name="char")


def train_tokenizer(kind: str, files: Sequence[str | Path], vocab_size: int, *, lowercase: bool = True,
                    min_frequency: int = 2, special_tokens: Sequence[str] | None = None,
                    progress: bool = False) -> Tokenizer:
    """Learn a vocabulary from text files with the `tokenizers` trainers.

    kind="wordpiece": BERT normalisation and pre-splitting, "##" continuations, specials
    [PAD] [UNK] [CLS] [SEP] [MASK] at ids 0-4. kind="bpe": byte-level BPE like GPT-2 (every byte is in
    the alphabet, so nothing is ever unknown), special <|endoftext|>. kind="bart": the same byte-level BPE
    with BART/RoBERTa's specials <s> <pad> </s> <unk> = ids 0-3 and <mask> last. kind="char": one token
    per character. kind="unigram": a SentencePiece Unigram model (<unk> <s> </s> <pad> = ids 0-3, "▁" marks
    a word's start; `min_frequency` and `lowercase` do not apply); saving also writes spiece.model.
    Save the result with `.save(dir)`; `load_tokenizer(dir)` reads it back.
    """
    files = [str(f) for f in files]
    if kind == "char":
        return build_char_tokenizer(files)
    if vocab_size < 1:
        raise ValueError(f"vocab_size={vocab_size} must be positive")
    if kind == "unigram":
        model = unigram.train_unigram(files, vocab_size, specials=tuple(special_tokens or unigram.UNIGRAM_SPECIALS),
                                      progress=progress)
        return _unigram_tokenizer(model, "sentencepiece", {}, "unigram")
    if kind == "wordpiece":
        specials = list(special_tokens or ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])  # BERT's ids 0-4
        backend = build_wordpiece({t: i for i, t in enumerate(specials)}, lowercase=lowercase)
        trainer = tk.trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                               special_tokens=specials, continuing_subword_prefix="##",
                                               show_progress=progress)
    elif kind in ("bpe", "bart"):
        specials = list(special_tokens or (["<|endoftext|>"] if kind == "bpe" else
                                           [FAIRSEQ_SPECIALS[r] for r in ("bos_token", "pad_token", "eos_token",
                                                                          "unk_token")]))
        backend = build_byte_level_bpe({}, [], specials=[])
        trainer = tk.trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=specials,
                                         initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
                                         show_progress=progress)
    else:
        raise ValueError(f"kind={kind!r}: expected wordpiece, bpe, bart, unigram or char")
    backend.train(files, trainer)
    if backend.get_vocab_size() <= len(specials):
        raise ValueError(f"no text to learn a vocabulary from in {', '.join(files)}")
    if kind == "wordpiece":  # rebuild so that the [CLS]/[SEP] template points at the learned ids
        vocab = backend.get_vocab(with_added_tokens=False)
        role = {t: r for r, t in BERT_SPECIALS.items()}
        return Tokenizer(build_wordpiece(vocab, lowercase=lowercase), specials={role.get(t, t): t for t in specials
                                                                                if t in role}, name="wordpiece")
    if kind == "bart":  # <mask> goes last, as in fairseq's dictionary; then the files load as BART's do
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            backend.model.save(tmp)
            vocab, merges = read_gpt2_files(tmp)
            tok = _fairseq_bpe({**vocab, FAIRSEQ_SPECIALS["mask_token"]: len(vocab)}, merges, Path(tmp))
        tok.name = "bart"
        return tok
    eot = specials[0]
    return Tokenizer(backend, specials={"bos_token": eot, "eos_token": eot, "unk_token": eot},
                     model_max_length=1024, name="bpe")
