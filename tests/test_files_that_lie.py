"""Model files that lie get one clear error naming the file and the field, never a crash from inside a parser,
a write outside the output folder, a read outside the model folder, or an allocation the file cannot justify.

Each input here is built by the test (a few hundred bytes): a GGUF whose tensors overlap or whose metadata
claims a model far larger than its tensors, nested arrays, head_count=0, a safetensors header nested
thousands deep, a SentencePiece file of 0xff bytes or with wrong wire types, modules.json paths that climb
out of the model folder, symlinks that escape it (and the Hugging Face cache's snapshot symlinks, which
stay inside their repository and must keep working)."""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest

from attnlab.config import ConfigError
from attnlab.interop import gguf as gguf_mod
from attnlab.interop.files import CheckpointError, check_safetensors, read_state_dict
from attnlab.interop.local import copy_sentence_modules, sentence_pooling
from attnlab.tokenizer_unigram import Piece, SentencePieceModel, read_model, write_model, UNKNOWN
from attnlab.tokenizers import load_tokenizer

pytest.importorskip("gguf")


# ----------------------------------------------------------------------------------- a raw GGUF writer
# Written by hand (not gguf.GGUFWriter) so that a test can say anything a hostile file could say.
U32, I32, F32, STR, ARR, U64 = 4, 5, 6, 8, 9, 10


def _s(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _val(kind: int, value) -> bytes:
    if isinstance(value, bytes):  # already encoded
        return value
    if kind == STR:
        return _s(value)
    if kind == ARR:  # value = (element kind, [element values])
        inner, items = value
        return struct.pack("<IQ", inner, len(items)) + b"".join(_val(inner, v) for v in items)
    return struct.pack({U32: "<I", I32: "<i", F32: "<f", U64: "<Q"}[kind], value)


def gguf_bytes(meta: list[tuple[str, int, object]], tensors: list[tuple[str, list[int], int, int]], data: bytes,
               n_kv: int | None = None, align: int = 32) -> bytes:
    """meta: (key, kind, value); tensors: (name, dims fastest first, ggml type, offset)."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta) if n_kv is None else n_kv)
    out += b"".join(_s(k) + struct.pack("<I", kind) + _val(kind, v) for k, kind, v in meta)
    for name, dims, kind, offset in tensors:
        out += _s(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        out += struct.pack("<IQ", kind, offset)
    out += b"\0" * (-len(out) % align)
    return out + data


def llama_meta(hidden=16, heads=2, ffn=32, layers=1, vocab=40, context=32, **over) -> list:
    meta = {"general.architecture": (STR, "llama"), "llama.block_count": (U32, layers),
            "llama.context_length": (U32, context), "llama.embedding_length": (U32, hidden),
            "llama.feed_forward_length": (U32, ffn), "llama.attention.head_count": (U32, heads),
            "llama.attention.head_count_kv": (U32, heads), "llama.attention.layer_norm_rms_epsilon": (F32, 1e-5),
            "llama.vocab_size": (U32, vocab)}
    meta.update(over)
    return [(k, kind, v) for k, (kind, v) in meta.items()]


def llama_tensors(hidden=16, ffn=32, vocab=40, layers=1) -> list[tuple[str, list[int]]]:
    """Names and dims (ggml order: fastest first) of a tiny LLaMA."""
    out = [("token_embd.weight", [hidden, vocab]), ("output_norm.weight", [hidden])]
    for i in range(layers):
        out += [(f"blk.{i}.attn_norm.weight", [hidden]), (f"blk.{i}.attn_q.weight", [hidden, hidden]),
                (f"blk.{i}.attn_k.weight", [hidden, hidden]), (f"blk.{i}.attn_v.weight", [hidden, hidden]),
                (f"blk.{i}.attn_output.weight", [hidden, hidden]), (f"blk.{i}.ffn_norm.weight", [hidden]),
                (f"blk.{i}.ffn_gate.weight", [hidden, ffn]), (f"blk.{i}.ffn_up.weight", [hidden, ffn]),
                (f"blk.{i}.ffn_down.weight", [ffn, hidden])]
    return out


def tiny_llama(meta=None, same_offset: bool = False, **sizes) -> bytes:
    """A valid F32 tiny LLaMA GGUF (or, with same_offset, one whose tensors all start at offset 0)."""
    shapes = llama_tensors(**sizes)
    rng = np.random.default_rng(0)
    infos, data = [], b""
    for name, dims in shapes:
        offset = 0 if same_offset else len(data)
        blob = rng.standard_normal(int(np.prod(dims))).astype(np.float32).tobytes()
        data += blob + b"\0" * (-len(blob) % 32)
        infos.append((name, dims, 0, offset))
    return gguf_bytes(meta if meta is not None else llama_meta(**sizes), infos, data)


@pytest.fixture(autouse=True)
def _fresh_readers():
    gguf_mod._reader.cache_clear() if hasattr(gguf_mod._reader, "cache_clear") else None
    yield


def _named(err: BaseException, path: Path, *fields: str) -> None:
    message = str(err)
    assert isinstance(err, ValueError), f"{type(err).__name__}: {message}"
    assert path.name in message, message
    for field in fields:
        assert field in message, message
    assert "\n" not in message


# ----------------------------------------------------------------------------------- GGUF
def test_a_valid_raw_gguf_loads(tmp_path):
    """The hand-written file is a real GGUF: without a lie it loads (so each lie below is what fails)."""
    import attnlab
    path = tmp_path / "ok.gguf"
    path.write_bytes(tiny_llama())
    model = attnlab.load(path)
    assert model.config.hidden_size == 16 and model.config.num_layers == 1


def test_tensors_sharing_bytes_are_refused(tmp_path):
    """Every tensor at offset 0 used to pass, each reading the first tensor's bytes."""
    path = tmp_path / "overlap.gguf"
    path.write_bytes(tiny_llama(same_offset=True))
    with pytest.raises(CheckpointError) as err:
        gguf_mod.metadata(path)
    _named(err.value, path, "overlap")


def test_tensor_range_past_the_end_is_refused_when_the_header_is_read(tmp_path):
    path = tmp_path / "huge.gguf"
    path.write_bytes(gguf_bytes(llama_meta(), [("token_embd.weight", [2 ** 40, 2 ** 20], 0, 0)], b"\0" * 64))
    with pytest.raises(CheckpointError) as err:
        gguf_mod.metadata(path)
    _named(err.value, path, "token_embd.weight")


@pytest.mark.parametrize("layers, field", [(48, "block_count"), (1, "token_embd.weight")])
def test_metadata_claiming_a_huge_model_is_refused_before_any_allocation(tmp_path, monkeypatch, layers, field):
    """A small file whose metadata describes a 40B-parameter model (tensors of the tiny one): the model
    skeleton (4 bytes a parameter) must never be built (it used to be, before any shape was checked)."""
    import attnlab

    def no_skeleton(cls, cfg):
        raise AssertionError(f"allocated a {cfg.hidden_size}-wide model before checking the file's shapes")
    monkeypatch.setattr(gguf_mod, "_skeleton", no_skeleton)
    path = tmp_path / "claims-40b.gguf"
    meta = llama_meta(hidden=8192, heads=64, ffn=28672, layers=layers, vocab=128256)
    path.write_bytes(tiny_llama(meta=meta))
    with pytest.raises((CheckpointError, ConfigError)) as err:
        attnlab.load(path)
    _named(err.value, path, field)


def test_deeply_nested_arrays_are_refused(tmp_path):
    """Used to raise RecursionError. Arrays of arrays are allowed two deep; deeper is an error naming the key."""
    value = struct.pack("<IQ", ARR, 1) * 3000 + struct.pack("<IQ2I", U32, 2, 1, 2)  # [[[...[1, 2]...]]]
    path = tmp_path / "nested.gguf"
    path.write_bytes(gguf_bytes(llama_meta() + [("evil.nested", ARR, value)], [], b""))
    with pytest.raises(CheckpointError) as err:
        gguf_mod.metadata(path)
    _named(err.value, path, "evil.nested")
    ok = tmp_path / "two-deep.gguf"
    ok.write_bytes(gguf_bytes(llama_meta() + [("fine.nested", ARR, (ARR, [(U32, [1, 2]), (U32, [3])]))], [], b""))
    assert gguf_mod.metadata(ok)["fine.nested"] == [[1, 2], [3]]


def test_array_longer_than_the_file_is_refused_naming_the_key(tmp_path):
    raw = gguf_bytes(llama_meta() + [("evil.count", ARR, (STR, ["a"]))], [], b"")
    i = raw.index(b"evil.count") + len("evil.count") + 4 + 4  # past the key, the value type, the element type
    raw = raw[:i] + struct.pack("<Q", 2 ** 62) + raw[i + 8:]
    path = tmp_path / "count.gguf"
    path.write_bytes(raw)
    with pytest.raises(CheckpointError) as err:
        gguf_mod.metadata(path)
    _named(err.value, path, "evil.count")


@pytest.mark.parametrize("size", ["short", "long"])
@pytest.mark.parametrize("bad", ["length", "utf-8", "split"])
def test_a_string_of_a_string_array_that_lies_is_named(tmp_path, bad, size):
    """A length past the end of the file, bytes that are not UTF-8, or a character split between two strings
    (each string invalid alone, the two joined valid) name the file and the key, in a short array (read
    string by string) and in a long one (read as one blob, gguf_file._string_blob)."""
    pad = [f"x{i}" for i in range(1100)] if size == "long" else []
    raw = gguf_bytes(llama_meta() + [("evil.tokens", ARR, (STR, ["ab", "cd", "ef", *pad]))], [], b"")
    i = raw.index(b"cd") - 8  # the second string's length
    if bad == "length":
        raw = raw[:i] + struct.pack("<Q", 2 ** 40) + raw[i + 8:]
    elif bad == "utf-8":
        raw = raw[:i + 8] + b"\xff\xfe" + raw[i + 10:]
    else:  # "ab" ends with the lead byte of "é", "cd" starts with its continuation byte
        raw = raw[:i - 1] + b"\xc3" + raw[i:i + 8] + b"\xa9" + raw[i + 9:]
    path = tmp_path / "strings.gguf"
    path.write_bytes(raw)
    with pytest.raises(CheckpointError) as err:
        gguf_mod.metadata(path)
    _named(err.value, path, "evil.tokens")
    if bad != "length":
        assert "string 1 of the array is not UTF-8" in str(err.value) or "string 0 " in str(err.value)


def test_a_long_string_array_reads_as_the_list_it_holds(tmp_path):
    """The blob path keeps every string as written: empty ones, multi-byte characters, at the array's ends."""
    strings = ["", "é", "日本語", "a b", "\u0120the", ""] + [f"t{i}" for i in range(1100)] + ["last é", ""]
    path = tmp_path / "long.gguf"
    path.write_bytes(gguf_bytes(llama_meta() + [("many", ARR, (STR, strings))], [], b""))
    got = gguf_mod.metadata(path)["many"]
    assert type(got).__name__ == "StringArray" and list(got) == strings and got[2] == "日本語"


@pytest.mark.parametrize("heads", [0, 3])
def test_head_count_zero_or_not_dividing_hidden_is_named(tmp_path, heads):
    """heads=0 used to raise ZeroDivisionError."""
    import attnlab
    path = tmp_path / f"heads{heads}.gguf"
    path.write_bytes(tiny_llama(meta=llama_meta(heads=heads)))
    with pytest.raises((CheckpointError, ConfigError)) as err:
        attnlab.load(path)
    _named(err.value, path, "head_count")


def test_replaced_file_is_read_again(tmp_path):
    """Readers were cached by path alone: after os.replace, the old metadata and tensor offsets stayed."""
    path = tmp_path / "model.gguf"
    path.write_bytes(tiny_llama(meta=llama_meta(context=32)))
    assert gguf_mod.metadata(path)["llama.context_length"] == 32
    assert gguf_mod.gguf_config(path).max_position_embeddings == 32
    new = tmp_path / "new.gguf"
    new.write_bytes(tiny_llama(meta=llama_meta(context=64) + [("general.name", STR, "replaced")]))
    os.replace(new, path)
    assert gguf_mod.metadata(path)["llama.context_length"] == 64
    assert gguf_mod.gguf_config(path).max_position_embeddings == 64


def test_bad_tokenizer_metadata_is_named(tmp_path):
    """A merge without a space, tokens that are numbers: the tokenizer error names the file."""
    import attnlab
    path = tmp_path / "tok.gguf"
    meta = llama_meta() + [("tokenizer.ggml.model", STR, "gpt2"), ("tokenizer.ggml.tokens", ARR, (U32, [1, 2])),
                           ("tokenizer.ggml.merges", ARR, (STR, ["ab"]))]
    path.write_bytes(gguf_bytes(meta, [], b""))
    with pytest.raises(CheckpointError) as err:
        attnlab.load_tokenizer(path)
    _named(err.value, path, "tokenizer.ggml.tokens")


# ----------------------------------------------------------------------------------- safetensors
def _safetensors(path: Path, header_text: str, data: bytes = b"") -> Path:
    body = header_text.encode()
    path.write_bytes(struct.pack("<Q", len(body)) + body + data)
    return path


def test_deeply_nested_safetensors_header_is_named(tmp_path):
    """Used to raise RecursionError from the JSON parser."""
    path = _safetensors(tmp_path / "nested.safetensors", '{"__metadata__": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(CheckpointError) as err:
        check_safetensors(path)
    _named(err.value, path)


def test_nested_metadata_in_safetensors_header_is_named(tmp_path):
    """__metadata__ is a flat map of strings (the format's spec); a nested one is refused."""
    path = _safetensors(tmp_path / "meta.safetensors", json.dumps({"__metadata__": {"a": {"b": [1]}}}))
    with pytest.raises(CheckpointError) as err:
        check_safetensors(path)
    _named(err.value, path, "__metadata__")


def test_giant_integer_in_safetensors_header_is_named(tmp_path):
    """Python's int-digit limit used to raise a bare ValueError that names neither file nor tensor."""
    header = '{"w": {"dtype": "F32", "shape": [1' + "0" * 5000 + '], "data_offsets": [0, 4]}}'
    path = _safetensors(tmp_path / "digits.safetensors", header, b"\0" * 4)
    with pytest.raises(CheckpointError) as err:
        check_safetensors(path)
    _named(err.value, path)


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"hidden_size": 1' + "0" * 5000 + "}"])
def test_config_json_nested_or_with_giant_numbers_is_named(tmp_path, text):
    from attnlab.interop.files import read_json
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        read_json(path)
    _named(err.value, path)


def test_overlapping_safetensors_ranges_are_named(tmp_path):
    header = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
              "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}
    path = _safetensors(tmp_path / "overlap.safetensors", json.dumps(header), b"\0" * 12)
    with pytest.raises(CheckpointError) as err:
        check_safetensors(path)
    _named(err.value, path, "'a'", "'b'")


# ----------------------------------------------------------------------------------- SentencePiece
def _spm_bytes(tmp_path: Path) -> bytes:
    model = SentencePieceModel([Piece("<unk>", 0.0, UNKNOWN), Piece("\u2581a", -1.0), Piece("b", -2.0)])
    return write_model(model, tmp_path / "ok.model").read_bytes()


def test_overlong_varint_is_refused_after_ten_bytes(tmp_path):
    """With no cap, a 5 MB file of 0xff shifted a million-bit integer for tens of minutes."""
    path = tmp_path / "ff.model"
    path.write_bytes(b"\xff" * 20_000)
    with pytest.raises(ValueError) as err:
        read_model(path)
    _named(err.value, path, "10 bytes")


@pytest.mark.parametrize("body, field", [
    # each used to escape as a TypeError or AttributeError
    (b"\x08\x05", "field 1"),                                # pieces as a varint
    (b"\x0a\x03\x08\x01\x00", "field 1"),                    # piece string as a varint
    (b"\x1a\x02\x08\x07" + b"\x12\x02\x08\x07", "field 1"),  # normalizer name as a varint
    (b"\x0a\x02\x10\x05", "field 2"),                        # piece score as a varint
], ids=["pieces-varint", "piece-string-varint", "normalizer-name-varint", "score-varint"])
def test_wrong_wire_types_are_named(tmp_path, body, field):
    path = tmp_path / "wire.model"
    path.write_bytes(_spm_bytes(tmp_path) + body)
    with pytest.raises(ValueError) as err:
        read_model(path)
    _named(err.value, path, field)


def test_length_past_the_end_is_named(tmp_path):
    path = tmp_path / "long.model"
    path.write_bytes(_spm_bytes(tmp_path) + b"\x0a\xff\xff\xff\x7f" + b"x" * 10)
    with pytest.raises(ValueError) as err:
        read_model(path)
    _named(err.value, path, "field 1")


def test_valid_sentencepiece_file_still_reads(tmp_path):
    path = tmp_path / "good.model"
    path.write_bytes(_spm_bytes(tmp_path))
    assert [p.piece for p in read_model(path).pieces] == ["<unk>", "\u2581a", "b"]


# ----------------------------------------------------------------------------------- tokenizer.json
def test_broken_tokenizer_json_is_named(tmp_path):
    """Used to be the Rust library's bare Exception, naming no file."""
    path = tmp_path / "tokenizer.json"
    path.write_text('{"model": {"type": "BPE", "vocab": 3}}')
    with pytest.raises(ValueError) as err:
        load_tokenizer(path)
    _named(err.value, path)


def test_tokenizer_json_that_panics_the_rust_library_is_named(tmp_path):
    """Found by research/fuzz/fuzz_readers.py: a BPE whose continuing_subword_prefix its merges lack makes
    the tokenizers library panic (bpe/model.rs: slice index out of range), a PanicException that is not
    even an Exception. It becomes a ValueError naming the file."""
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]],
                                          "continuing_subword_prefix": "##"}}))
    with pytest.raises(ValueError) as err:
        load_tokenizer(path)
    _named(err.value, path)


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"cls_token": {"no_content": 1}}'])
def test_broken_tokenizer_config_is_named(tmp_path, text):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a"]) + "\n")
    (tmp_path / "tokenizer_config.json").write_text(text)
    with pytest.raises(ValueError) as err:
        load_tokenizer(tmp_path)
    _named(err.value, tmp_path / "tokenizer_config.json")


# ----------------------------------------------------------------------------------- paths from files
def _sentence_model(root: Path, pooling_path: str = "1_Pooling") -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text("{}")
    (root / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": pooling_path, "type": "sentence_transformers.models.Pooling"}]))
    return root


def _pooling(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))


def test_modules_json_path_climbing_out_is_refused(tmp_path):
    """A "../../secret" in modules.json used to copy files from outside the model into outside the output."""
    src = _sentence_model(tmp_path / "a" / "b" / "model", "../../secret")
    _pooling(tmp_path / "a" / "secret")
    (tmp_path / "a" / "secret" / "id_rsa").write_text("private")
    out = tmp_path / "x" / "y" / "out"
    out.mkdir(parents=True)
    with pytest.raises(CheckpointError) as err:
        copy_sentence_modules(src, out)
    _named(err.value, src / "modules.json", "../../secret")
    assert not (tmp_path / "x" / "secret").exists() and not list(out.rglob("id_rsa"))
    with pytest.raises(CheckpointError):
        sentence_pooling(src)


@pytest.mark.parametrize("path", ["/etc", "1_Pooling/../../elsewhere"])
def test_absolute_or_dotdot_module_paths_are_refused(tmp_path, path):
    src = _sentence_model(tmp_path / "model", path)
    with pytest.raises(CheckpointError) as err:
        copy_sentence_modules(src, tmp_path / "out")
    _named(err.value, src / "modules.json", path)


def test_symlink_escaping_the_model_is_refused(tmp_path):
    """A module file that is a symlink to a file outside the model folder is not copied (nor read)."""
    secret = tmp_path / "secret.txt"
    secret.write_text("private")
    src = _sentence_model(tmp_path / "model")
    _pooling(src / "1_Pooling")
    (src / "1_Pooling" / "notes.txt").symlink_to(secret)
    out = tmp_path / "out"
    with pytest.raises(CheckpointError) as err:
        copy_sentence_modules(src, out)
    _named(err.value, src / "1_Pooling" / "notes.txt")
    assert not (out / "1_Pooling" / "notes.txt").exists()


def _hf_cache_model(tmp_path: Path) -> Path:
    """The Hugging Face hub cache's layout: snapshots/<rev>/<file> are symlinks into ../../blobs/<hash>."""
    repo = tmp_path / "hub" / "models--org--name"
    snap, blobs = repo / "snapshots" / "abc123", repo / "blobs"
    blobs.mkdir(parents=True)
    files = {"config.json": "{}",
             "modules.json": json.dumps([{"path": "", "type": "sentence_transformers.models.Transformer"},
                                         {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]),
             "1_Pooling/config.json": json.dumps({"pooling_mode_mean_tokens": True})}
    for i, (name, text) in enumerate(files.items()):
        (blobs / f"blob{i}").write_text(text)
        link = snap / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blobs / f"blob{i}", link.parent))
    return snap


def test_hf_cache_snapshot_symlinks_are_followed(tmp_path):
    snap = _hf_cache_model(tmp_path)
    assert sentence_pooling(snap) == "mean"
    out = tmp_path / "out"
    out.mkdir()
    assert copy_sentence_modules(snap, out) == "mean"
    assert json.loads((out / "1_Pooling" / "config.json").read_text()) == {"pooling_mode_mean_tokens": True}
    assert not (out / "1_Pooling" / "config.json").is_symlink()


def _tiny_bert(directory: Path) -> None:
    import torch
    from attnlab.config import ModelConfig
    from attnlab.interop.hf import save_pretrained
    from attnlab.models.encoder import Encoder
    torch.manual_seed(0)
    save_pretrained(Encoder(ModelConfig(vocab_size=50, hidden_size=16, num_layers=1, num_heads=2,
                                        intermediate_size=32, max_position_embeddings=16)), directory)


def _shard(directory: Path) -> None:
    """Turn model.safetensors into a one-shard index pointing at model-00001-of-00001.safetensors."""
    from safetensors import safe_open
    with safe_open(str(directory / "model.safetensors"), "pt") as fh:
        names = list(fh.keys())
    (directory / "model.safetensors").rename(directory / "model-00001-of-00001.safetensors")
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {n: "model-00001-of-00001.safetensors" for n in names}}))


def test_shard_symlink_escaping_the_model_is_refused(tmp_path):
    """The shard name is a plain file name (the lexical check passes) but the file is a symlink to one outside."""
    model = tmp_path / "model"
    _tiny_bert(model)
    _shard(model)
    outside = tmp_path / "elsewhere.safetensors"
    (model / "model-00001-of-00001.safetensors").rename(outside)
    (model / "model-00001-of-00001.safetensors").symlink_to(outside)
    with pytest.raises(CheckpointError) as err:
        read_state_dict(model)
    _named(err.value, model / "model-00001-of-00001.safetensors", "outside")


def test_hf_cache_shards_are_read(tmp_path):
    repo = tmp_path / "hub" / "models--org--bert"
    snap, blobs = repo / "snapshots" / "rev", repo / "blobs"
    _tiny_bert(snap)
    _shard(snap)
    blobs.mkdir()
    for f in list(snap.iterdir()):
        f.rename(blobs / f.name)
        f.symlink_to(Path("..", "..", "blobs", f.name))
    sd, source = read_state_dict(snap)
    assert source.name == "model.safetensors.index.json" and "embeddings.word_embeddings.weight" in sd


@pytest.mark.parametrize("text, field", [("{" * 5000, "not valid JSON"), ('{"n": ' + "9" * 5000 + "}", "not valid JSON"),
                                         ("[1, 2]", "expected a JSON object"), ('{"extra": 3}', "extra")])
def test_attnlab_config_json_that_lies_is_named(tmp_path, text, field):
    """attnlab's own layout (attnlab_config.json): bad JSON, nesting thousands deep, a 5000-digit integer or
    a field of the wrong kind is one error naming the file (once: RecursionError, a bare ValueError, ...)."""
    from attnlab.interop.native import NATIVE_CONFIG, load_native
    (tmp_path / NATIVE_CONFIG).write_text(text)
    with pytest.raises(ConfigError, match=rf"{NATIVE_CONFIG}.*{field}"):
        load_native(tmp_path)


def test_string_array_tolist_equals_iterating():
    from attnlab.gguf_file import StringArray
    strings = ["", "é", "日本語", "", "a\x00b", "z"]
    for case in (strings, [s for s in strings if "\x00" not in s], [], [""]):
        arr = StringArray.of(case)
        assert arr.tolist() == list(arr) == case
