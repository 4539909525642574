"""Decoders are the Encoder stack with causal=True plus an LM head: GPT-2 and LLaMA-style checkpoints from
transformers load with equal logits and identical greedy generations, and save back to a layout
transformers loads (both directions)."""
from __future__ import annotations

import json

import pytest
import torch

import attnlab
from attnlab.config import ConfigError, ModelConfig
from attnlab.inference.generate import generate
from attnlab.models.decoder import CausalLM
from attnlab.models.encoder import Encoder

transformers = pytest.importorskip("transformers")


def gpt2_hf(tmp_path, **shape):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(**shape)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    model.save_pretrained(tmp_path / "hf")
    return model, tmp_path / "hf"


def llama_hf(tmp_path, **shape):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**shape)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.save_pretrained(tmp_path / "hf")
    return model, tmp_path / "hf"


def check_parity(hf_model, ours, vocab: int, seq: int = 12, new_tokens: int = 32) -> None:
    torch.manual_seed(1)
    ids = torch.randint(0, vocab, (2, seq))
    with torch.no_grad():
        want = hf_model(ids).logits
        got = ours(ids).logits
    assert got.shape == want.shape
    assert (got - want).abs().max().item() <= 1e-5, (got - want).abs().max().item()
    prompt = ids[:1, :6]
    with torch.no_grad():
        want_ids = hf_model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                                     min_new_tokens=new_tokens, do_sample=False)
    got_ids = generate(ours, prompt, max_new_tokens=new_tokens, eos_token_id=[])
    assert got_ids.tolist() == want_ids.tolist()


def check_save_back(ours, hf_cls, tmp_path, vocab: int) -> None:
    out = ours.save(tmp_path / "ours")
    reloaded = hf_cls.from_pretrained(out).eval()
    ids = torch.randint(0, vocab, (1, 9))
    with torch.no_grad():
        assert (reloaded(ids).logits - ours(ids).logits).abs().max().item() <= 1e-5


SMALL_GPT2 = dict(vocab_size=1000, n_positions=64, n_embd=64, n_layer=2, n_head=4)


def test_gpt2_small_parity_both_directions(tmp_path):
    hf_model, path = gpt2_hf(tmp_path, **SMALL_GPT2)
    ours = attnlab.load(path)
    assert isinstance(ours, CausalLM) and isinstance(ours.backbone, Encoder)
    cfg = ours.config
    assert (cfg.causal, cfg.position, cfg.norm_placement, cfg.activation) == (True, "learned", "pre", "gelu_tanh")
    assert not cfg.embedding_norm and cfg.has_final_norm and not cfg.pooler and cfg.type_vocab_size == 0
    assert ours.lm_head.weight is ours.backbone.embeddings.tok.weight  # tied
    check_parity(hf_model, ours, 1000)
    check_save_back(ours, transformers.GPT2LMHeadModel, tmp_path, 1000)
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert saved["architectures"] == ["GPT2LMHeadModel"] and saved["n_embd"] == 64


def test_gpt2_124m_shape_parity_both_directions(tmp_path):
    # The real GPT-2 small shape (random weights: nothing is downloaded), short input
    hf_model, path = gpt2_hf(tmp_path, n_layer=12, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257)
    ours = attnlab.load(path)
    assert ours.num_parameters() == sum(p.numel() for p in hf_model.parameters()) == 124_439_808
    check_parity(hf_model, ours, 50257, seq=8)
    check_save_back(ours, transformers.GPT2LMHeadModel, tmp_path, 50257)


def test_gpt2_backbone_and_loss(tmp_path):
    hf_model, path = gpt2_hf(tmp_path, **SMALL_GPT2)
    backbone = attnlab.load(path, architecture="GPT2Model")
    ids = torch.randint(0, 1000, (2, 10))
    with torch.no_grad():
        want = hf_model.transformer(ids).last_hidden_state
        assert (backbone(ids).last_hidden_state - want).abs().max() <= 1e-5
        ours = attnlab.load(path)
        loss_hf = hf_model(ids, labels=ids).loss
        assert abs(ours(ids, labels=ids).loss.item() - loss_hf.item()) <= 1e-5


@pytest.mark.parametrize("kv_heads", [2, 1])  # GQA and MQA
def test_llama_parity_both_directions(tmp_path, kv_heads):
    shape = dict(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=128,
                 rope_theta=50000.0, tie_word_embeddings=False)
    hf_model, path = llama_hf(tmp_path, **shape)
    ours = attnlab.load(path)
    cfg = ours.config
    assert (cfg.norm, cfg.activation, cfg.position, cfg.bias, cfg.kv_heads) == ("rmsnorm", "swiglu", "rope", False, kv_heads)
    assert cfg.rope_theta == 50000.0
    assert ours.lm_head.weight is not ours.backbone.embeddings.tok.weight  # untied, as configured
    check_parity(hf_model, ours, 512)
    check_save_back(ours, transformers.LlamaForCausalLM, tmp_path, 512)
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert saved["architectures"] == ["LlamaForCausalLM"] and saved["num_key_value_heads"] == kv_heads


def test_llama_tied_head(tmp_path):
    hf_model, path = llama_hf(tmp_path, vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                              num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    ours = attnlab.load(path)
    assert ours.lm_head.weight is ours.backbone.embeddings.tok.weight
    check_parity(hf_model, ours, 300, new_tokens=8)


def test_decoder_needs_causal_and_unsupported_configs_are_named(tmp_path):
    with pytest.raises(ValueError, match="causal=True"):
        CausalLM(ModelConfig(vocab_size=10, hidden_size=8, num_layers=1, num_heads=2, intermediate_size=16))
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "config.json").write_text(json.dumps(
        {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 1,
         "intermediate_size": 64, "vocab_size": 100, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}))
    with pytest.raises(ConfigError, match="rope_type='llama3'"):
        attnlab.load(tmp_path / "d")
    (tmp_path / "d" / "config.json").write_text(json.dumps(
        {"model_type": "gpt2", "n_embd": 32, "n_head": 4, "n_layer": 1, "activation_function": "quick_gelu"}))
    with pytest.raises(ConfigError, match="activation_function='quick_gelu'"):
        attnlab.load(tmp_path / "d")


def test_from_config_decoder_round_trip(tmp_path):
    cfg = ModelConfig(model_type="llama", vocab_size=128, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                      intermediate_size=64, position="rope", norm="rmsnorm", norm_placement="pre",
                      activation="swiglu", bias=False, causal=True, embedding_norm=False, pooler=False,
                      type_vocab_size=0, pad_token_id=None, dropout=0.0, attention_dropout=0.0)
    model = attnlab.from_config(cfg).eval()
    assert isinstance(model, CausalLM)
    model.save(tmp_path / "m")
    again = attnlab.load(tmp_path / "m")
    ids = torch.randint(0, 128, (1, 7))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, again(ids).logits)
