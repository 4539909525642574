"""SentencePiece Unigram models (Kudo 2018) read from their `.model` file, without sentencepiece or protobuf.

A `.model` file is one protobuf `ModelProto` message (sentencepiece_model.proto): the pieces with their
log-probabilities and types, the trainer's settings (unk/bos/eos/pad ids, byte_fallback) and the
normalizer's (a precompiled character map such as nmt_nfkc, add_dummy_prefix, remove_extra_whitespaces,
escape_whitespaces). `read_model` decodes the few fields we need with a 40-line wire-format reader.

Encoding a line, as sentencepiece does it:
  1. normalize     each longest prefix of the input found in the charsmap's trie is replaced by its rule
                   (NFKC plus NMT clean-ups); runs of spaces collapse, leading/trailing spaces go
  2. escape        a "▁" is prepended (add_dummy_prefix) and every space becomes "▁":
                   "Two  dogs " -> "▁Two▁dogs"
  3. Viterbi       the segmentation maximising the sum of piece log-probabilities, over the whole line;
                   a character no piece covers costs min_score - 10 and becomes <unk> (or its UTF-8 bytes
                   <0x..> with byte_fallback); user-defined pieces always win where they match
The Rust `tokenizers` library has each step (Precompiled normalizer, Unigram model with byte fallback),
so `build_unigram` assembles them; tests/test_unigram.py holds the ids equal to sentencepiece's on
every Multi30k line. Training (EM over a seed vocabulary, then pruning the pieces whose removal costs
the least likelihood) uses the Rust UnigramTrainer; `write_model` saves the result as a `.model` file
that sentencepiece itself loads.
"""
from __future__ import annotations

import dataclasses
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

import tokenizers as tk

__all__ = ["Piece", "SentencePieceModel", "read_model", "write_model", "build_unigram", "MODEL_FILES",
           "sentencepiece_family", "build_family", "train_unigram", "UNIGRAM_SPECIALS"]

# ModelProto.SentencePiece.Type
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPACE = "\u2581"  # "▁", how sentencepiece writes a space inside pieces
UNIGRAM, BPE = 1, 2


@dataclass
class Piece:
    piece: str
    score: float = 0.0
    type: int = NORMAL


@dataclass
class SentencePieceModel:
    """What encoding and decoding need from a ModelProto (field numbers from sentencepiece_model.proto)."""
    pieces: list[Piece]
    model_type: int = UNIGRAM
    byte_fallback: bool = False
    unk_surface: str = " \u2047 "
    treat_whitespace_as_suffix: bool = False
    normalizer_name: str = ""
    precompiled_charsmap: bytes = b""
    add_dummy_prefix: bool = True
    remove_extra_whitespaces: bool = True
    escape_whitespaces: bool = True
    trainer: dict = field(default_factory=dict)  # the other TrainerSpec fields we read, by name

    def id_of(self, kind: int) -> int | None:
        return next((i for i, p in enumerate(self.pieces) if p.type == kind), None)


# ----------------------------------------------------------------------------------------------
# The protobuf wire format: each field is a varint key (number << 3 | wire type) then its value

MAX_VARINT_BYTES = 10  # 64 bits, 7 a byte: protobuf's own limit


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    for _ in range(MAX_VARINT_BYTES):  # capped: a run of 0xff bytes would otherwise grow one integer forever
        if pos >= len(data):
            raise ValueError("truncated varint")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
    raise ValueError(f"a varint longer than {MAX_VARINT_BYTES} bytes at offset {pos - MAX_VARINT_BYTES}")


_WIRE_NAMES = {0: "varint", 1: "fixed64", 2: "length-delimited", 5: "fixed32"}


def _fields(data: bytes, message: str):
    """Yield (field number, wire type, value) of the protobuf `message` (its name goes in the errors): ints
    for varints, bytes for fixed and length-delimited fields; every length is checked against the bytes
    left before anything is sliced."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            yield number, wire, value
            continue
        if wire == 2:
            size, pos = _varint(data, pos)
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
        else:
            raise ValueError(f"field {number} of {message}: unsupported protobuf wire type {wire}")
        if size > len(data) - pos:
            raise ValueError(f"field {number} of {message}: {size} bytes, {len(data) - pos} left in the message")
        yield number, wire, data[pos:pos + size]
        pos += size


def _expect(number: int, wire: int, want: int, message: str) -> None:
    if wire != want:
        raise ValueError(f"field {number} of {message} is {_WIRE_NAMES.get(wire, wire)}, expected "
                         f"{_WIRE_NAMES[want]}")


def _text(value: bytes, number: int, message: str) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"field {number} of {message} is not UTF-8") from None


_TRAINER_FIELDS = {3: "model_type", 4: "vocab_size", 35: "byte_fallback", 24: "treat_whitespace_as_suffix",
                   40: "unk_id", 41: "bos_id", 42: "eos_id", 43: "pad_id", 44: "unk_surface",
                   45: "unk_piece", 46: "bos_piece", 47: "eos_piece", 48: "pad_piece"}
_TRAINER_TEXT = (44, 45, 46, 47, 48)
_NORMALIZER_FIELDS = {1: "normalizer_name", 2: "precompiled_charsmap", 3: "add_dummy_prefix",
                      4: "remove_extra_whitespaces", 5: "escape_whitespaces"}
_NORMALIZER_BYTES = (1, 2)


def read_model(path: str | Path) -> SentencePieceModel:
    """Parse a sentencepiece `.model` file (ModelProto) into a `SentencePieceModel`. A damaged file is a
    ValueError naming the file and the field (number and message) where it went wrong."""
    path = Path(path)
    data = path.read_bytes()
    try:
        pieces, trainer, norm = [], {}, {}
        for number, wire, value in _fields(data, "ModelProto"):
            if number == 1:  # repeated SentencePiece {piece=1, score=2 (float), type=3}
                _expect(number, wire, 2, "ModelProto (pieces)")
                p = Piece("")
                for n, w, v in _fields(value, "SentencePiece"):
                    if n == 1:
                        _expect(n, w, 2, "SentencePiece (piece)")
                        p.piece = _text(v, n, "SentencePiece (piece)")
                    elif n == 2:
                        _expect(n, w, 5, "SentencePiece (score)")
                        p.score = struct.unpack("<f", v)[0]
                    elif n == 3:
                        _expect(n, w, 0, "SentencePiece (type)")
                        p.type = v
                pieces.append(p)
            elif number in (2, 3):  # TrainerSpec, NormalizerSpec
                _expect(number, wire, 2, "ModelProto")
                name = "TrainerSpec" if number == 2 else "NormalizerSpec"
                names, out = (_TRAINER_FIELDS, trainer) if number == 2 else (_NORMALIZER_FIELDS, norm)
                texts = _TRAINER_TEXT if number == 2 else _NORMALIZER_BYTES
                for n, w, v in _fields(value, name):
                    if n in names:
                        _expect(n, w, 2 if n in texts else 0, f"{name} ({names[n]})")
                        out[names[n]] = _text(v, n, f"{name} ({names[n]})") if number == 2 and n in texts else v
    except (ValueError, struct.error) as e:
        raise ValueError(f"{path}: not a sentencepiece model file ({e})") from None
    if not pieces:
        raise ValueError(f"{path}: not a sentencepiece model file (no pieces)")
    model = SentencePieceModel(pieces, trainer=dict(trainer))
    model.model_type = trainer.get("model_type", UNIGRAM)
    model.byte_fallback = bool(trainer.get("byte_fallback", False))
    model.treat_whitespace_as_suffix = bool(trainer.get("treat_whitespace_as_suffix", False))
    if "unk_surface" in trainer:
        model.unk_surface = trainer["unk_surface"]
    try:
        model.normalizer_name = norm.get("normalizer_name", b"").decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a sentencepiece model file (field 1 of NormalizerSpec is not UTF-8)") from None
    model.precompiled_charsmap = norm.get("precompiled_charsmap", b"")
    for name in ("add_dummy_prefix", "remove_extra_whitespaces", "escape_whitespaces"):
        setattr(model, name, bool(norm.get(name, True)))
    if model.model_type != UNIGRAM:
        raise ValueError(f"{path}: a sentencepiece {'BPE' if model.model_type == BPE else 'non-Unigram'} model "
                         f"(model_type={model.model_type}); only Unigram models are supported")
    if model.treat_whitespace_as_suffix:
        raise ValueError(f"{path}: treat_whitespace_as_suffix models are not supported")
    if model.id_of(UNKNOWN) is None:
        raise ValueError(f"{path}: the model has no unknown piece (type UNKNOWN)")
    return model


def _key(number: int, wire: int) -> bytes:
    return _enc_varint(number << 3 | wire)


def _enc_varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _bytes_field(number: int, value: bytes) -> bytes:
    return _key(number, 2) + _enc_varint(len(value)) + value


def write_model(model: SentencePieceModel, path: str | Path) -> Path:
    """Write `model` as a ModelProto that sentencepiece.SentencePieceProcessor(model_file=path) loads."""
    out = bytearray()
    for p in model.pieces:
        body = _bytes_field(1, p.piece.encode("utf-8")) + _key(2, 5) + struct.pack("<f", p.score)
        if p.type != NORMAL:
            body += _key(3, 0) + _enc_varint(p.type)
        out += _bytes_field(1, body)
    ids = {"unk_id": model.id_of(UNKNOWN)}
    trainer = _key(3, 0) + _enc_varint(UNIGRAM) + _key(4, 0) + _enc_varint(len(model.pieces))
    trainer += _key(35, 0) + _enc_varint(int(model.byte_fallback))
    for name, number in (("unk_id", 40), ("bos_id", 41), ("eos_id", 42), ("pad_id", 43)):
        value = model.trainer.get(name, ids.get(name, -1))
        trainer += _key(number, 0) + _enc_varint(value & 0xFFFFFFFFFFFFFFFF)  # int32 -1: ten-byte varint
    out += _bytes_field(2, trainer)
    norm = _bytes_field(1, model.normalizer_name.encode("utf-8"))
    if model.precompiled_charsmap:
        norm += _bytes_field(2, model.precompiled_charsmap)
    for name, number in (("add_dummy_prefix", 3), ("remove_extra_whitespaces", 4), ("escape_whitespaces", 5)):
        norm += _key(number, 0) + _enc_varint(int(getattr(model, name)))
    out += _bytes_field(3, norm)
    path = Path(path)
    path.write_bytes(bytes(out))
    return path


# ----------------------------------------------------------------------------------------------
# The encoding pipeline on the Rust library

# sentencepiece's lattice holds only normal and user-defined pieces; the Rust one holds every piece, so the
# others get a score no path takes while another exists. The unknown-character cost (min score - 10) moves
# with it, which changes no segmentation: an unknown character has no other piece covering it.
_NEVER = -1e6


def build_unigram(model: SentencePieceModel, before: list | None = None) -> tk.Tokenizer:
    """A `tokenizers.Tokenizer` that encodes and decodes as sentencepiece does with `model`.

    Where it still differs from sentencepiece (none of it occurs in Multi30k; a fuzz of random Unicode
    found nothing else):
    - the Rust charsmap lookup works on grapheme clusters, sentencepiece's on the longest matching prefix,
      so a combining mark after a mapped character ("ﬁ" + U+0308) and decomposed Hangul jamo normalize
      differently (transformers' fast tokenizers share this);
    - control pieces typed literally ("<s>", "</s>") are those pieces, as in transformers; sentencepiece
      spells them out character by character. So do we for "<unk>" and "<0x41>", unless one of their
      characters is itself unknown (then one such piece costs less than two unknowns).
    """
    norm = list(before or [])  # a family's own clean-ups ahead of sentencepiece's (ALBERT lower-cases)
    if model.precompiled_charsmap:
        norm.append(tk.normalizers.Precompiled(model.precompiled_charsmap))
    if model.remove_extra_whitespaces:
        # only " " counts, as in sentencepiece's normalizer (a tab the charsmap keeps stays)
        norm += [tk.normalizers.Replace(tk.Regex(" {2,}"), " "), tk.normalizers.Replace(tk.Regex("^ | $"), "")]
    if model.add_dummy_prefix:
        norm.append(tk.normalizers.Prepend(SPACE if model.escape_whitespaces else " "))
    if model.escape_whitespaces:
        norm.append(tk.normalizers.Replace(" ", SPACE))
    # sentencepiece gives user-defined pieces length * max_score - 0.1, where max_score starts at FLT_MIN
    # (a positive number), so with the usual all-negative log-probabilities they score -0.1 (unigram_model.cc)
    max_score = max([1.17549435e-38] + [p.score for p in model.pieces if p.type == NORMAL])
    vocab = [(p.piece, len(p.piece.encode("utf-8")) * max_score - 0.1 if p.type == USER_DEFINED
              else _NEVER if p.type in (UNKNOWN, BYTE, UNUSED) else p.score) for p in model.pieces]
    backend = tk.Tokenizer(tk.models.Unigram(vocab, unk_id=model.id_of(UNKNOWN), byte_fallback=model.byte_fallback))
    backend.normalizer = tk.normalizers.Sequence(norm)
    # <unk> decodes to unk_surface (" ⁇ "), which the leading-space strip below must not touch: it is
    # parked as a noncharacter (never in real text) until the strip is done
    unk, parked = model.pieces[model.id_of(UNKNOWN)].piece, "\ufdd0"
    decoders = [tk.decoders.Replace(unk, parked), tk.decoders.Replace(SPACE, " "), tk.decoders.ByteFallback(),
                tk.decoders.Fuse()]
    if model.add_dummy_prefix or model.remove_extra_whitespaces:
        # sentencepiece drops the leading "▁" of the first piece; all leading ones when it removes extra spaces
        decoders.append(tk.decoders.Strip(" ", 10**6 if model.remove_extra_whitespaces else 1, 0))
    decoders.append(tk.decoders.Replace(parked, model.unk_surface))
    backend.decoder = tk.decoders.Sequence(decoders)
    # control pieces (<s>, </s>, <pad>, <cls>) are never produced by text and decode to nothing
    backend.add_special_tokens([tk.AddedToken(p.piece, special=True, normalized=False)
                                for p in model.pieces if p.type == CONTROL])
    return backend


# ----------------------------------------------------------------------------------------------
# Training

UNIGRAM_SPECIALS = ("<unk>", "<s>", "</s>", "<pad>")  # sentencepiece's default ids 0-2, then a pad at 3


def train_unigram(files, vocab_size: int, *, specials=UNIGRAM_SPECIALS, max_piece_length: int = 16,
                  progress: bool = False) -> SentencePieceModel:
    """Learn a Unigram vocabulary (Kudo 2018, §3.2) with the Rust trainer: seed pieces from the frequent
    substrings, EM re-estimates their probabilities, then the 25% whose removal lowers the likelihood
    least are pruned, until `vocab_size` pieces remain (specials included).

    Like sentencepiece's trainer, words are the units (spaces become "▁" at the start of each word, so no
    piece spans two words); unlike it, the text is not NFKC-normalised (sentencepiece's
    normalization_rule_name=identity), so that the saved spiece.model means the same to both libraries.
    """
    backend = tk.Tokenizer(tk.models.Unigram())
    backend.pre_tokenizer = tk.pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="always", split=True)
    trainer = tk.trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=list(specials), unk_token=specials[0],
                                         max_piece_length=max_piece_length, show_progress=progress)
    backend.train([str(f) for f in files], trainer)
    learned = json.loads(backend.to_str())["model"]["vocab"]  # (piece, log-probability) pairs
    if len(learned) <= len(specials):
        raise ValueError(f"no text to learn a vocabulary from in {', '.join(map(str, files))}")
    kinds = {t: CONTROL for t in specials} | {specials[0]: UNKNOWN}
    pieces = [Piece(t, 0.0 if t in kinds else float(score), kinds.get(t, NORMAL)) for t, score in learned]
    ids = {f"{role}_id": i for i, role in enumerate(("unk", "bos", "eos", "pad")[:len(specials)])}
    return SentencePieceModel(pieces, normalizer_name="identity", trainer=ids)


# ----------------------------------------------------------------------------------------------
# The checkpoints' layouts: which specials each model family puts around sentencepiece's ids

MODEL_FILES = ("spiece.model", "sentencepiece.bpe.model")  # T5 / ALBERT / XLNet, XLM-R (a Unigram despite the name)
_CLASSES = {"t5": "t5", "mt5": "t5", "albert": "albert", "xlnet": "xlnet", "xlmroberta": "xlm-roberta",
            "xlm-roberta": "xlm-roberta"}


def sentencepiece_family(model_file: Path, config: dict, model_type: str | None) -> str:
    """"t5", "albert", "xlnet", "xlm-roberta" or "sentencepiece" (ids exactly as the .model gives them), from
    tokenizer_config.json's tokenizer_class, else config.json's model_type, else the file's name."""
    cls = str(config.get("tokenizer_class") or "").lower().removesuffix("fast").removesuffix("tokenizer")
    for key in (cls, (model_type or "").lower().replace("_", "-")):
        if key in _CLASSES:
            return _CLASSES[key]
    return "xlm-roberta" if model_file.name == "sentencepiece.bpe.model" else "sentencepiece"


def _signed(value: int) -> int:  # an int32 field written as a 64-bit varint: -1 arrives as 2**64 - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def build_family(model: SentencePieceModel, family: str, config: dict) -> tuple[tk.Tokenizer, dict[str, str], int]:
    """(backend, role -> token, model_max_length) for `family`, as transformers' tokenizers of that name
    build them from the same .model file."""
    pieces, before, extra = list(model.pieces), [], []
    if family == "xlm-roberta":
        # fairseq's dictionary: <s> <pad> </s> <unk> first, so every other piece moves up by one (Conneau et al.
        # 2020 reuse fairseq's RoBERTa code); sentencepiece's own <unk> <s> </s> (ids 0-2) give way, <mask> last
        pieces = [Piece("<s>", 0, CONTROL), Piece("<pad>", 0, CONTROL), Piece("</s>", 0, CONTROL),
                  Piece("<unk>", 0, UNKNOWN), *[p for p in pieces[3:]], Piece("<mask>", 0, CONTROL)]
        specials = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
                    "mask_token": "<mask>", "cls_token": "<s>", "sep_token": "</s>"}
        single, pair = "<s> $A </s>", "<s> $A </s> </s> $B </s>"
    elif family == "t5":
        # 100 sentinels for span corruption after the pieces, <extra_id_0> last (Raffel et al. 2020, §3.1.4)
        extra = [f"<extra_id_{i}>" for i in reversed(range(int(config.get("extra_ids", 100))))]
        specials = {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
        single, pair = "$A </s>", "$A </s> $B </s>"
    elif family in ("albert", "xlnet"):
        # both clean text before sentencepiece: `` and '' become ", accents go (NFKD), ALBERT lower-cases
        before = [tk.normalizers.Replace("``", '"'), tk.normalizers.Replace("''", '"')]
        if not config.get("keep_accents", False):
            before += [tk.normalizers.NFKD(), tk.normalizers.StripAccents()]
        if config.get("do_lower_case", family == "albert"):
            before.append(tk.normalizers.Lowercase())
        if family == "albert":
            specials = {"bos_token": "[CLS]", "eos_token": "[SEP]", "unk_token": "<unk>", "sep_token": "[SEP]",
                        "pad_token": "<pad>", "cls_token": "[CLS]", "mask_token": "[MASK]"}
            single, pair = "[CLS]:0 $A:0 [SEP]:0", "[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1"
        else:  # XLNet puts its <sep> <cls> at the end, <cls> with segment id 2 (Yang et al. 2019, §2.5)
            specials = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "sep_token": "<sep>",
                        "pad_token": "<pad>", "cls_token": "<cls>", "mask_token": "<mask>"}
            single, pair = "$A:0 <sep>:0 <cls>:2", "$A:0 <sep>:0 $B:1 <sep>:1 <cls>:2"
    else:  # plain sentencepiece: its own <unk>, and <s> </s> <pad> where the trainer gave them ids; no template
        specials, single = {}, None
        for role, default in (("unk", 0), ("bos", 1), ("eos", 2), ("pad", -1)):
            i = _signed(model.trainer.get(f"{role}_id", default))
            if 0 <= i < len(pieces):
                specials[f"{role}_token"] = pieces[i].piece
    model = dataclasses.replace(model, pieces=pieces)
    missing = [t for t in specials.values() if t not in {p.piece for p in pieces}]
    if missing:
        raise ValueError(f"a {family} sentencepiece model needs the pieces {', '.join(sorted(set(missing)))}")
    backend = build_unigram(model, before)
    backend.add_special_tokens([tk.AddedToken(t, special=True, normalized=False)
                                for t in [*specials.values(), *extra] if t != model.pieces[model.id_of(UNKNOWN)].piece])
    if single is not None:
        ids = {t: backend.token_to_id(t) for t in specials.values()}
        backend.post_processor = tk.processors.TemplateProcessing(
            single=single, pair=pair, special_tokens=[(t, i) for t, i in ids.items() if t in single + pair])
    max_length = config.get("model_max_length")
    if not isinstance(max_length, int) or max_length >= 1_000_000:
        max_length = 512
    return backend, specials, max_length
