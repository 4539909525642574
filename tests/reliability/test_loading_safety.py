"""Loading is safe: a pickle that would run code is refused before it runs, and damaged safetensors / GGUF
files give an attnlab error (a ValueError) naming the file and the tensor instead of a crash or a
silently wrong model."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab.config import ModelConfig
from attnlab.interop.files import CheckpointError
from attnlab.interop.hf import save_pretrained
from attnlab.models.encoder import Encoder

REPO = Path(__file__).resolve().parents[2]
TINY = dict(vocab_size=50, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
            max_position_embeddings=16)


@pytest.fixture()
def bert_dir(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    directory = tmp_path / "bert"
    save_pretrained(Encoder(ModelConfig(**TINY)), directory)
    return directory


class _Payload:
    """Unpickling this calls open(path, "w"): a file appears if the pickle is executed."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_no_unsafe_loaders_in_the_package():
    """Every torch.load passes weights_only=True; nothing calls pickle, yaml.load or np.load(allow_pickle)."""
    for path in (REPO / "attnlab").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        for line in text.splitlines():
            if "torch.load(" in line:
                assert "weights_only=True" in line, f"{path}: {line.strip()}"
        for banned in ("import pickle", "pickle.load", "yaml.load(", "yaml.unsafe_load", "allow_pickle=True",
                       "import dill", "import joblib"):
            assert banned not in text, f"{path} uses {banned}"


def test_malicious_pickle_is_refused_and_never_runs(bert_dir: Path, tmp_path: Path):
    target = tmp_path / "pwned.txt"
    from safetensors.torch import load_file
    sd = load_file(str(bert_dir / "model.safetensors"))
    sd["embeddings.word_embeddings.weight"] = _Payload(target)
    (bert_dir / "model.safetensors").unlink()
    torch.save(sd, bert_dir / "pytorch_model.bin")
    with pytest.raises(CheckpointError) as err:
        attnlab.load(bert_dir)
    assert "pytorch_model.bin" in str(err.value) and "weights_only" in str(err.value)
    assert "\n" not in str(err.value)  # one line, not torch's page of advice
    assert not target.exists(), "the pickle ran: a file was created during loading"


def test_plain_tensor_pickle_still_loads(bert_dir: Path):
    from safetensors.torch import load_file
    sd = load_file(str(bert_dir / "model.safetensors"))
    (bert_dir / "model.safetensors").unlink()
    torch.save(sd, bert_dir / "pytorch_model.bin")
    model = attnlab.load(bert_dir)
    assert torch.equal(model.embeddings.tok.weight, sd["embeddings.word_embeddings.weight"])


# ----------------------------------------------------------------------------------- safetensors
def _split(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _write(path: Path, header: dict, data: bytes) -> None:
    body = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(body)) + body + data)


WORD = "embeddings.word_embeddings.weight"


def _damage(directory: Path, how: str) -> str:
    """Damage model.safetensors one way; returns the tensor name the error must mention ("" = none)."""
    path = directory / "model.safetensors"
    header, data = _split(path)
    if how == "truncated":  # the last tensor's bytes are cut off
        last = max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][1])
        path.write_bytes(path.read_bytes()[:-7])
        return last
    if how == "offsets_past_end":
        header[WORD]["data_offsets"][1] = len(data) + 1000
    elif how == "size_lie":  # offsets inside the file, but not the size shape x dtype needs
        header[WORD]["shape"] = [header[WORD]["shape"][0] + 1, header[WORD]["shape"][1]]
    elif how == "negative_offset":
        header[WORD]["data_offsets"] = [-8, header[WORD]["data_offsets"][1]]
    elif how == "unknown_dtype":
        header[WORD]["dtype"] = "Q4_K"
    elif how == "wrong_dtype":  # a valid dtype of the right byte size, but integers where weights belong
        header[WORD]["dtype"] = "I32"
    elif how == "wrong_shape":  # consistent file, tensor of another shape than the config says
        rows, cols = header[WORD]["shape"]
        header[WORD]["shape"] = [rows // 2, cols * 2]
    elif how == "shape_not_ints":
        header[WORD]["shape"] = ["50", 16]
    elif how == "header_length_lie":
        raw = path.read_bytes()
        path.write_bytes(struct.pack("<Q", 10 ** 9) + raw[8:])
        return ""
    elif how == "header_not_json":
        raw = path.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        path.write_bytes(raw[:8] + b"\xff" * n + raw[8 + n:])
        return ""
    else:
        raise AssertionError(how)
    _write(path, header, data)
    return WORD


@pytest.mark.parametrize("how", ["truncated", "offsets_past_end", "size_lie", "negative_offset", "unknown_dtype",
                                 "wrong_dtype", "wrong_shape", "shape_not_ints", "header_length_lie",
                                 "header_not_json"])
def test_damaged_safetensors_named(bert_dir: Path, how: str):
    tensor = _damage(bert_dir, how)
    with pytest.raises(CheckpointError) as err:
        attnlab.load(bert_dir)
    message = str(err.value)
    assert isinstance(err.value, ValueError)
    assert "model.safetensors" in message, message
    assert tensor in message, message
    assert "\n" not in message


def test_empty_safetensors_file_named(bert_dir: Path):
    (bert_dir / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match="model.safetensors"):
        attnlab.load(bert_dir)


def test_shard_outside_the_directory_is_not_read(bert_dir: Path, tmp_path: Path):
    (bert_dir / "model.safetensors").rename(tmp_path / "outside.safetensors")
    (bert_dir / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {WORD: "../outside.safetensors"}}))
    with pytest.raises(CheckpointError, match="outside.safetensors"):
        attnlab.load(bert_dir)


def test_native_layout_weights_are_checked_too(tmp_path: Path):
    """attnlab's own layout (attnlab_state.safetensors) goes through the same header check."""
    from attnlab.interop.native import RAW_WEIGHTS, load_native
    directory = tmp_path / "native"
    directory.mkdir()
    cfg = ModelConfig(**TINY)
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in Encoder(cfg).state_dict().items()}, str(directory / RAW_WEIGHTS))
    (directory / "attnlab_config.json").write_text(json.dumps(cfg.to_dict()))
    (directory / RAW_WEIGHTS).write_bytes((directory / RAW_WEIGHTS).read_bytes()[:-5])
    with pytest.raises(CheckpointError, match=RAW_WEIGHTS):
        load_native(directory)


# ----------------------------------------------------------------------------------- GGUF
def _tiny_gguf(path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    import numpy as np
    hidden, heads, ffn, vocab = 16, 2, 32, 40
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(32)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    rng = np.random.default_rng(0)
    shapes = {"token_embd.weight": (vocab, hidden), "output_norm.weight": (hidden,),
              "blk.0.attn_norm.weight": (hidden,), "blk.0.attn_q.weight": (hidden, hidden),
              "blk.0.attn_k.weight": (hidden, hidden), "blk.0.attn_v.weight": (hidden, hidden),
              "blk.0.attn_output.weight": (hidden, hidden), "blk.0.ffn_norm.weight": (hidden,),
              "blk.0.ffn_gate.weight": (ffn, hidden), "blk.0.ffn_up.weight": (ffn, hidden),
              "blk.0.ffn_down.weight": (hidden, ffn)}
    for name, shape in shapes.items():
        w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_tiny_gguf_loads(tmp_path: Path):
    _tiny_gguf(tmp_path / "ok.gguf")
    model = attnlab.load(tmp_path / "ok.gguf")
    assert model.config.hidden_size == 16


@pytest.mark.parametrize("keep", [0, 3, 20, 200, 0.5, -4])
def test_truncated_gguf_named(tmp_path: Path, keep):
    """Cut anywhere (empty, in the magic, in the key/values, in the tensor infos, in the data):
    always a CheckpointError naming the file."""
    full = tmp_path / "full.gguf"
    _tiny_gguf(full)
    raw = full.read_bytes()
    n = int(len(raw) * keep) if isinstance(keep, float) else (len(raw) + keep if keep < 0 else keep)
    path = tmp_path / f"cut-{n}.gguf"
    path.write_bytes(raw[:n])
    with pytest.raises(CheckpointError) as err:
        attnlab.load(path)
    assert str(path) in str(err.value) or path.name in str(err.value)
    if keep == -4:  # only the data is short: the error names the tensor too
        assert "blk.0.ffn_down.weight" in str(err.value)


def test_gguf_with_lying_counts_named(tmp_path: Path):
    """A header claiming 2**60 key/values or an array longer than the file stops at the file's end."""
    full = tmp_path / "full.gguf"
    _tiny_gguf(full)
    raw = bytearray(full.read_bytes())
    struct.pack_into("<Q", raw, 16, 2 ** 60)  # n_kv
    lie = tmp_path / "lie.gguf"
    lie.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="lie.gguf"):
        attnlab.load(lie)
