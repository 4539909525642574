"""Writing GGUF (F32, Q8_0, Q4_0): read back by attnlab equal to what was written (F32 exactly, block types
equal to ggml's reference quantization), the tokenizer metadata copied, and llama.cpp's llama-perplexity
loading the file when it is built (ATTNLAB_LLAMA_CPP_BIN)."""
from __future__ import annotations

import math
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import attnlab
from attnlab.config import ConfigError
from attnlab.interop.files import CheckpointError
from attnlab.interop.gguf import _reader, unpermute_rope
from attnlab.interop.gguf_write import permute_rope, save_gguf
from attnlab.interop.local import resolve

gguf = pytest.importorskip("gguf")


def tiny_source(path: Path) -> Path:
    """A tiny LLaMA GGUF with a byte-level tokenizer (256 single-byte tokens, no merges) in its metadata."""
    torch.manual_seed(0)
    w = gguf.GGUFWriter(str(path), "llama")
    for add, value in ((w.add_block_count, 2), (w.add_context_length, 128), (w.add_embedding_length, 64),
                       (w.add_feed_forward_length, 96), (w.add_head_count, 4), (w.add_head_count_kv, 2),
                       (w.add_rope_dimension_count, 16), (w.add_rope_freq_base, 10000.0),
                       (w.add_layer_norm_rms_eps, 1e-5), (w.add_vocab_size, 256)):
        add(value)
    w.add_tokenizer_model("gpt2")
    from tokenizers.pre_tokenizers import ByteLevel
    w.add_token_list(sorted(ByteLevel.alphabet()))
    w.add_token_types([1] * 256)
    w.add_token_merges([])
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    shapes = {"token_embd.weight": (256, 64), "output_norm.weight": (64,)}
    for i in range(2):
        shapes.update({f"blk.{i}.attn_norm.weight": (64,), f"blk.{i}.attn_q.weight": (64, 64),
                       f"blk.{i}.attn_k.weight": (32, 64), f"blk.{i}.attn_v.weight": (32, 64),
                       f"blk.{i}.attn_output.weight": (64, 64), f"blk.{i}.ffn_norm.weight": (64,),
                       f"blk.{i}.ffn_gate.weight": (96, 64), f"blk.{i}.ffn_up.weight": (96, 64),
                       f"blk.{i}.ffn_down.weight": (64, 96)})
    for name, shape in shapes.items():
        w.add_tensor(name, (1 + 0.1 * torch.randn(shape) if len(shape) == 1 else 0.1 * torch.randn(shape)).numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    src = tiny_source(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    return src, attnlab.load(src)


def test_permute_inverts_unpermute():
    w = torch.arange(8 * 16 * 3, dtype=torch.float32).reshape(128, 3)
    assert torch.equal(unpermute_rope(permute_rope(w, 8), 8), w)
    assert not torch.equal(permute_rope(w, 8), w)


def test_f32_round_trip_is_exact_with_the_tokenizer(tiny, tmp_path):
    src, model = tiny
    out = save_gguf(model, tmp_path / "f32.gguf", "F32", like=src)
    back = attnlab.load(out)
    for name, t in model.state_dict().items():
        assert torch.equal(back.state_dict()[name], t), name
    ids = torch.randint(0, 256, (2, 9))
    with torch.no_grad():
        assert torch.equal(back(ids).logits, model(ids).logits)
    meta = _reader(str(out.resolve())).meta
    assert meta["general.file_type"] == 0 and meta["tokenizer.ggml.tokens"] == _reader(str(src.resolve())).meta[
        "tokenizer.ggml.tokens"]
    assert attnlab.load_tokenizer(out).encode("hello, world") == attnlab.load_tokenizer(src).encode("hello, world")


@pytest.mark.parametrize("qtype,embed", [("Q8_0", "Q8_0"), ("Q4_0", "Q8_0")])
def test_block_types_read_back_as_ggml_reference_quantization(tiny, tmp_path, qtype, embed):
    """Every matrix reads back as gguf's reference quantize -> dequantize of what was written; norms stay
    F32; with Q4_0 the embedding is Q8_0."""
    from gguf.quants import dequantize, quantize
    src, model = tiny
    out = save_gguf(model, tmp_path / f"{qtype}.gguf", qtype, like=src)
    kinds = {name: gguf.GGMLQuantizationType(kind).name for name, _, kind, _ in _reader(str(out.resolve())).tensors}
    assert kinds["token_embd.weight"] == embed and kinds["blk.1.ffn_down.weight"] == qtype
    assert kinds["blk.0.attn_norm.weight"] == "F32"
    back = attnlab.load(out).state_dict()
    for name, t in model.state_dict().items():
        if t.ndim == 1:
            assert torch.equal(back[name], t), name
            continue
        kind = gguf.GGMLQuantizationType[embed if name in ("backbone.embeddings.tok.weight", "lm_head.weight") else qtype]
        expect = torch.from_numpy(dequantize(quantize(t.numpy(), kind), kind)).float()
        assert torch.equal(back[name], expect), name  # Q/K rows permuted there and back without loss
        bound = t.abs().max().item() / (127 if kind.name == "Q8_0" else 7)
        assert (back[name] - t).abs().max().item() <= bound


def test_bad_requests_are_named(tiny, tmp_path):
    src, model = tiny
    with pytest.raises(ValueError, match="qtype must be one of"):
        save_gguf(model, tmp_path / "x.gguf", "Q3_K", like=src)
    with pytest.raises(CheckpointError, match="not the model's tokenizer"):
        save_gguf(model, tmp_path / "x.gguf", "F32", like=resolve("smollm2"))
    with pytest.raises(ConfigError, match="LLaMA-style decoders only.*model_type='bert'"):
        save_gguf(attnlab.from_config("bert-tiny"), tmp_path / "x.gguf", "F32", like=src)
    assert not (tmp_path / "x.gguf").exists()


@pytest.fixture(scope="module")
def smol_q8(tmp_path_factory):
    src = resolve("smollm2")
    model = attnlab.load(src)
    return src, model, save_gguf(model, tmp_path_factory.mktemp("smol") / "smol-q8_0.gguf", "Q8_0", like=src)


def test_real_q8_0_costs_little_perplexity(smol_q8, data_dir):
    """SmolLM2 (its Q4_1 weights dequantized) written as Q8_0: size about 145 MB, perplexity within 0.5% of
    the dequantized fp32 model on 3,000 characters of WikiText-2."""
    from attnlab.tasks.lm import perplexity
    src, model, q8 = smol_q8
    assert 140e6 < q8.stat().st_size < 150e6
    text = (data_dir / "wikitext-2" / "valid.txt").read_text(encoding="utf-8")[:3000]
    fp32 = perplexity(model, attnlab.load_tokenizer(src), text, context=256, convention="llama.cpp")["perplexity"]
    got = perplexity(attnlab.load(q8), attnlab.load_tokenizer(q8), text, context=256, convention="llama.cpp")
    assert got["tokens"] > 512 and abs(got["perplexity"] / fp32 - 1) < 5e-3


def llama_cpp_bin() -> Path:
    bin_dir = os.environ.get("ATTNLAB_LLAMA_CPP_BIN")
    if not bin_dir or not (Path(bin_dir) / "llama-perplexity").is_file():
        pytest.skip("llama.cpp is not built: scripts/build-llama-cpp.sh, then ATTNLAB_LLAMA_CPP_BIN=.../build/bin")
    return Path(bin_dir)


def no_repack() -> list[str]:
    """llama.cpp's repacked weights crash its tools on AMX CPUs (SIGSEGV): there, its plain path."""
    from attnlab.nn.precision import cpu_flags
    return ["--no-repack"] if "amx_int8" in cpu_flags() else []


def test_q4_0_bytes_equal_llama_quantize(smol_q8, tmp_path):
    """llama.cpp's own quantizer, Q4_1 -> Q4_0 (--allow-requantize), writes the same bytes for every one of
    the 272 tensors as attnlab does from the dequantized weights (its embedding falls back to Q8_0 too)."""
    bin_dir = llama_cpp_bin()
    src, model, _ = smol_q8
    theirs = tmp_path / "theirs.gguf"
    run = subprocess.run([str(bin_dir / "llama-quantize"), "--allow-requantize", str(src), str(theirs), "Q4_0", "1"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    ours = save_gguf(model, tmp_path / "ours.gguf", "Q4_0", like=src)
    a, b = _reader(str(theirs.resolve())), _reader(str(ours.resolve()))
    by_name = {t[0]: t for t in a.tensors}
    assert sorted(by_name) == sorted(t[0] for t in b.tensors) and len(b.tensors) == 272
    for t in b.tensors:
        u = by_name[t[0]]
        assert u[1:3] == t[1:3], t[0]  # shape and type
        assert np.array_equal(a.tensor_bytes(*u), b.tensor_bytes(*t)), t[0]


def test_llama_cpp_loads_what_attnlab_writes(smol_q8, data_dir, tmp_path):
    """llama.cpp's own llama-perplexity reads the Q8_0 file and scores the text within 1% of attnlab on the
    same file (it multiplies the quantized weights with 8-bit quantized activations and an F16 KV cache)."""
    bin_dir = llama_cpp_bin()
    from attnlab.tasks.lm import perplexity
    _, _, q8 = smol_q8
    text = (data_dir / "wikitext-2" / "valid.txt").read_text(encoding="utf-8")[:3000]
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    run = subprocess.run([str(Path(bin_dir) / "llama-perplexity"), "-m", str(q8), "-f", str(tmp_path / "t.txt"),
                          "-c", "256", "-t", "1", *no_repack()], capture_output=True, text=True, timeout=300)
    found = re.search(r"Final estimate: PPL = ([0-9.]+)", run.stdout + run.stderr)
    assert run.returncode == 0 and found, (run.stdout + run.stderr)[-2000:]
    ours = perplexity(attnlab.load(q8), attnlab.load_tokenizer(q8), text, context=256, convention="llama.cpp")
    assert math.isfinite(ours["perplexity"]) and abs(float(found.group(1)) / ours["perplexity"] - 1) < 0.01
