"""`attnlab evaluate lm`: perplexity equal to a direct transformers computation of the same convention
(transformers' sliding window, llama-perplexity's chunks), batching that changes nothing, the real
SmolLM2 GGUF against transformers' own GGUF loading, and bad input as one line with exit status 2."""
from __future__ import annotations

import json
import math

import pytest
import torch

import attnlab
from attnlab.cli import main
from attnlab.tasks.lm import (LMInputError, hf_windows, llama_cpp_windows, perplexity, read_text,
                              window_nll)
from conftest import transformers_from_gguf

transformers = pytest.importorskip("transformers")
VOCAB = 300


def random_hf(kind: str, tmp_path):
    torch.manual_seed(0)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4)
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
        model = transformers.LlamaForCausalLM(cfg)
    model.eval().save_pretrained(tmp_path / kind)
    return model, attnlab.load(tmp_path / kind)


def hf_sliding_window(model, ids: torch.Tensor, context: int, stride: int) -> tuple[float, int]:
    """transformers' documented recipe, with the NLL summed over exactly the tokens its loss averaged."""
    total, count, prev_end = 0.0, 0, 0
    for begin in range(0, ids.size(1), stride):
        end = min(begin + context, ids.size(1))
        inp = ids[:, begin:end]
        labels = inp.clone()
        labels[:, :-(end - prev_end)] = -100
        with torch.no_grad():
            loss = model(inp, labels=labels).loss
        n = (labels[:, 1:] != -100).sum().item()  # the loss shifts labels left by one
        total, count, prev_end = total + loss.double().item() * n, count + n, end
        if end == ids.size(1):
            break
    return total, count


def hf_llama_cpp(model, ids: torch.Tensor, n_ctx: int, bos: int | None) -> tuple[float, int]:
    """llama-perplexity's loop on a transformers model: chunk, BOS first, score targets n_ctx/2+1 .."""
    total, count = 0.0, 0
    first = n_ctx // 2
    for i in range(ids.size(1) // n_ctx):
        chunk = ids[:, i * n_ctx:(i + 1) * n_ctx].clone()
        if bos is not None:
            chunk[0, 0] = bos
        with torch.no_grad():
            logp = torch.log_softmax(model(chunk).logits[0].double(), -1)
        targets = chunk[0, first + 1:]
        total -= logp[first:n_ctx - 1].gather(1, targets[:, None]).sum().item()
        count += len(targets)
    return total, count


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_sliding_window_equals_transformers_batched_or_not(kind, tmp_path):
    hf, ours = random_hf(kind, tmp_path)
    torch.manual_seed(1)
    ids = torch.randint(0, VOCAB, (1, 203))
    for context, stride in [(64, 32), (48, 17), (64, 64)]:
        want, want_n = hf_sliding_window(hf, ids, context, stride)
        windows = hf_windows(ids[0].tolist(), context, stride)
        got, n = window_nll(ours, windows, batch_size=1)
        batched, n_batched = window_nll(ours, windows, batch_size=8)
        assert n == want_n == n_batched
        assert abs(got - want) <= 1e-5 * abs(want), (context, stride, got, want)
        assert abs(batched - got) <= 1e-5 * abs(got)
    # overlapping windows score every token after the first exactly once
    assert sum(w.scored for w in hf_windows(list(range(203)), 64, 32)) == 202


def test_stride_equal_to_context_is_the_non_overlapping_number(tmp_path):
    hf, ours = random_hf("gpt2", tmp_path)
    torch.manual_seed(2)
    ids = torch.randint(0, VOCAB, (1, 150))
    total, count = 0.0, 0
    for begin in range(0, 150, 50):  # independent chunks, each scoring all but its first token
        chunk = ids[:, begin:begin + 50]
        with torch.no_grad():
            total += hf(chunk, labels=chunk).loss.double().item() * (chunk.size(1) - 1)
        count += chunk.size(1) - 1
    got, n = window_nll(ours, hf_windows(ids[0].tolist(), 50, 50), batch_size=2)
    assert n == count == 147
    assert abs(got - total) <= 1e-5 * total


@pytest.mark.parametrize("kind,bos", [("gpt2", None), ("llama", 1)])
def test_llama_cpp_convention_equals_transformers(kind, bos, tmp_path):
    hf, ours = random_hf(kind, tmp_path)
    torch.manual_seed(3)
    ids = torch.randint(2, VOCAB, (1, 170))
    want, want_n = hf_llama_cpp(hf, ids, 32, bos)
    windows = llama_cpp_windows(ids[0].tolist(), 32, bos)
    got, n = window_nll(ours, windows, batch_size=3)
    assert n == want_n == 5 * 15 and all(w.ids[0] == (bos if bos is not None else w.ids[0]) for w in windows)
    assert abs(got - want) <= 1e-5 * want
    with pytest.raises(LMInputError, match="at least 64"):
        llama_cpp_windows(list(range(63)), 32, bos)


def test_head_nll_over_vocabulary_tiles_equals_cross_entropy(monkeypatch):
    """Batches of many scored rows take the vocabulary a tile at a time with a running log-sum-exp."""
    from attnlab.tasks import lm
    torch.manual_seed(4)
    head = torch.nn.Linear(16, 50)
    rows, targets = torch.randn(70, 16) * 3, torch.randint(0, 50, (70,))
    with torch.no_grad():
        want = torch.nn.functional.cross_entropy(head(rows).double(), targets, reduction="sum").item()
        for tile in (7, 50, 64):  # a short last tile, one tile exactly, one larger than the vocabulary
            monkeypatch.setattr(lm, "_VOCAB_TILE", tile)
            got = lm._head_nll(head, rows, targets)
            assert abs(got - want) <= 1e-6 * want, (tile, got, want)


# --- the real SmolLM2 GGUF -------------------------------------------------------------------------------

def test_smollm2_gguf_wikitext_equals_transformers(data_dir):
    from attnlab.interop.local import resolve
    path = resolve("smollm2")
    text = (data_dir / "wikitext-2" / "valid.txt").read_text(encoding="utf-8")[:2400]
    model, tok = attnlab.load(path), attnlab.load_tokenizer(path)
    got = perplexity(model, tok, text, context=128, stride=64, batch_size=4)
    hf, hf_tok = transformers_from_gguf(path)
    ids = hf_tok(text, return_tensors="pt").input_ids
    assert got["tokens"] == ids.size(1) and ids.size(1) > 4 * 128  # several windows, each sliding by 64
    total, count = hf_sliding_window(hf, ids, 128, 64)
    assert got["scored_tokens"] == count == ids.size(1) - 1
    want = math.exp(total / count)
    assert abs(got["perplexity"] - want) <= 1e-3 * want, (got["perplexity"], want)
    assert 5 < want < 100  # a real model on real English, not a broken one


# --- the CLI: JSON out, bad input as one line with status 2 ----------------------------------------------

@pytest.fixture(scope="module")
def char_lm(tmp_path_factory):
    """A random GPT-2 over a character vocabulary, with its tokenizer, in a model directory."""
    from attnlab.tokenizers import build_char_tokenizer
    root = tmp_path_factory.mktemp("charlm")
    corpus = root / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog\n" * 20, encoding="utf-8")
    tok = build_char_tokenizer([corpus])
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=len(tok), n_positions=128, n_embd=32, n_layer=2, n_head=4)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(root / "model")
    tok.save(root / "model")
    return root


def test_cli_prints_metrics(char_lm, capsys):
    assert main(["evaluate", "lm", "--model", str(char_lm / "model"), "--data", str(char_lm / "corpus.txt"),
                 "--context", "64", "--stride", "32", "--batch-size", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tokens"] == 880 and out["scored_tokens"] == 879 and out["context"] == 64
    assert math.isclose(out["perplexity"], math.exp(out["mean_nll"]))
    # a character model: bytes == tokens here (ASCII), so bits per byte = mean NLL over all tokens / ln 2
    assert math.isclose(out["bits_per_byte"], out["mean_nll"] * 879 / 880 / math.log(2))
    assert math.isclose(out["word_perplexity"], math.exp(out["mean_nll"] * 879 / 180))
    assert out["tokens_per_s"] > 0
    assert 20 < out["perplexity"] < 60  # random init over ~28 characters: near uniform


def test_bf16_scores_near_fp32_and_leaves_the_model_alone(char_lm, capsys):
    """--dtype bf16 runs a bf16 copy: the JSON says so, perplexity within 1% of fp32's, the model given to
    perplexity() stays fp32; an unknown dtype is an input error."""
    args = ["evaluate", "lm", "--model", str(char_lm / "model"), "--data", str(char_lm / "corpus.txt"),
            "--context", "64", "--stride", "32"]
    assert main(args) == 0
    fp32 = json.loads(capsys.readouterr().out)
    assert main([*args, "--dtype", "bf16"]) == 0
    bf16 = json.loads(capsys.readouterr().out)
    assert fp32["dtype"] == "fp32" and bf16["dtype"] == "bf16" and bf16["scored_tokens"] == fp32["scored_tokens"]
    assert bf16["perplexity"] != fp32["perplexity"] and abs(bf16["perplexity"] / fp32["perplexity"] - 1) < 0.01
    model, tok = attnlab.load(char_lm / "model"), attnlab.load_tokenizer(char_lm / "model")
    text = (char_lm / "corpus.txt").read_text()
    assert perplexity(model, tok, text, context=64, dtype="bf16")["dtype"] == "bf16"
    assert next(model.parameters()).dtype == torch.float32
    with pytest.raises(LMInputError, match="--dtype 'fp8'"):
        perplexity(model, tok, text, context=64, dtype="fp8")


@pytest.mark.parametrize("content,args,message", [
    (b"", [], "the file is empty"),
    (b"ab\xffcd", [], "invalid UTF-8 at byte 2"),
    (b"a", [], "scoring needs at least 2"),
    (b"the fox " * 10, ["--context", "16", "--stride", "17"], "--stride 17 is larger than --context 16"),
    (b"the fox " * 10, ["--context", "999"], "longer than the model's maximum"),
    (b"the fox " * 10, ["--convention", "llama.cpp", "--context", "64"], "needs at least 128"),
])
def test_cli_bad_input_exits_2(char_lm, tmp_path, capsys, content, args, message):
    data = tmp_path / "in.txt"
    data.write_bytes(content)
    assert main(["evaluate", "lm", "--model", str(char_lm / "model"), "--data", str(data), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnlab evaluate: error:") and message in err and "\n" not in err


def test_cli_model_without_lm_head_exits_2(minilm, tmp_path, capsys):
    data = tmp_path / "in.txt"
    data.write_text("some text to score", encoding="utf-8")
    assert main(["evaluate", "lm", "--model", str(minilm), "--data", str(data)]) == 2
    assert "has no causal language-model head" in capsys.readouterr().err


def test_read_text_names_the_file(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\n\n  \n")
    with pytest.raises(LMInputError, match="bad.txt: the file is empty"):
        read_text(bad)


def test_masked_lm_pseudo_perplexity_equals_transformers(minilm, tmp_path, capsys):
    """A random BERT MLM with MiniLM's WordPiece tokenizer: each token masked in turn, as a direct loop."""
    import shutil
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=64)
    hf = transformers.BertForMaskedLM(cfg).eval()
    hf.save_pretrained(tmp_path / "mlm")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(minilm / name, tmp_path / "mlm" / name)
    text = "the quick brown fox jumps over the lazy dog " * 6  # 54 tokens: two chunks at context 32
    data = tmp_path / "text.txt"
    data.write_text(text, encoding="utf-8")
    assert main(["evaluate", "lm", "--model", str(tmp_path / "mlm"), "--data", str(data), "--context", "32",
                 "--batch-size", "7"]) == 0
    got = json.loads(capsys.readouterr().out)
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "mlm")
    ids = tok(text, add_special_tokens=False).input_ids
    total = 0.0
    for start in range(0, len(ids), 30):
        chunk = [tok.cls_token_id, *ids[start:start + 30], tok.sep_token_id]
        for p in range(1, len(chunk) - 1):
            masked = torch.tensor([chunk])
            masked[0, p] = tok.mask_token_id
            with torch.no_grad():
                total -= torch.log_softmax(hf(masked).logits[0, p].double(), -1)[chunk[p]].item()
    assert got["tokens"] == got["scored_tokens"] == len(ids) == 54
    assert abs(got["mean_nll"] - total / 54) <= 1e-5 * total / 54


@pytest.mark.parametrize("kernel", [True, False])
def test_the_tiled_lm_head_nll_equals_cross_entropy_with_and_without_the_c_pass(kernel, monkeypatch):
    """`_head_nll` folds vocabulary tiles into a running log-sum-exp, with nn/fused.py's one C pass per tile or
    (kernel=False, as without a compiler) torch's ops: both the summed fp32 cross-entropy of the full logits."""
    import attnlab.tasks.lm as lm
    if not kernel:
        monkeypatch.setattr(lm, "lse_tile", lambda *a: False)
    gen = torch.Generator().manual_seed(3)
    head = torch.nn.Linear(48, 5000, bias=True)
    with torch.no_grad():
        head.weight.normal_(0, 0.5, generator=gen)
        rows, targets = torch.randn(200, 48, generator=gen), torch.randint(0, 5000, (200,), generator=gen)
        ref = torch.nn.functional.cross_entropy(head(rows), targets, reduction="sum").item()
        assert lm._head_nll(head, rows, targets) == pytest.approx(ref, rel=1e-6)
