"""LoRA and bottleneck adapters (attnlab/nn/lora.py) and the PEFT layout (attnlab/interop/peft.py).

peft is the oracle: on random-init tiny LLaMA and BERT models with the same weights, attnlab's adapted
model and peft's give the same outputs (<= 1e-5), whichever side wrote the adapter directory.
"""
from __future__ import annotations

import json

import pytest
import torch

import attnlab
from attnlab.interop.peft import apply_bottleneck, apply_lora, load_adapter, save_adapter
from attnlab.nn.lora import LoRALinear, LoraSettings, adapter_modules, mark_only_adapters_trainable, merge_lora, unmerge_lora

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

TOL = 1e-5


def _hf(tmp_path, family: str):
    """A random-init tiny LlamaForCausalLM or BertForSequenceClassification, saved; (model, its directory)."""
    torch.manual_seed(0)
    shape = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 max_position_embeddings=64)
    if family == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(num_key_value_heads=2, **shape))
    else:
        model = transformers.BertForSequenceClassification(transformers.BertConfig(num_labels=3, **shape))
    model.eval().save_pretrained(tmp_path / "base")
    return model, tmp_path / "base"


def _hf_llama(tmp_path):
    return _hf(tmp_path, "llama")


def _hf_bert(tmp_path):
    return _hf(tmp_path, "bert")


def _ids(n=9):
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 97, (2, n), generator=g)


def _randomize_adapters(model, seed=3):
    """Non-zero B (a fresh LoRA is exactly the base model, which would make parity trivially true)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name or "adapter_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)


def _peft_model(hf_model, targets, r=4, alpha=8, task_type=None):
    cfg = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, task_type=task_type)
    return peft.get_peft_model(hf_model, cfg).eval()


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_peft_loads_attnlab_adapter(tmp_path, family):
    hf_model, base = (_hf_llama if family == "llama" else _hf_bert)(tmp_path)
    ours = attnlab.load(base)
    targets = ["q", "v", "ffn.up", "attn.o"]          # attnlab's names; the config gets HF's
    apply_lora(ours, targets, r=4, alpha=8)
    _randomize_adapters(ours)
    save_adapter(ours, tmp_path / "ad")
    config = json.loads((tmp_path / "ad" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4
    theirs = peft.PeftModel.from_pretrained(hf_model, tmp_path / "ad").eval()
    ids = _ids()
    with torch.no_grad():
        a, b = ours(ids).logits, theirs(input_ids=ids).logits
    assert (a - b).abs().max().item() <= TOL
    # and the adapter really changes the output (the test above is not base == base)
    with torch.no_grad(), theirs.disable_adapter():
        plain = theirs(input_ids=ids).logits
    assert (a - plain).abs().max().item() > 10 * TOL


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_attnlab_loads_peft_adapter(tmp_path, family):
    hf_model, base = (_hf_llama if family == "llama" else _hf_bert)(tmp_path)
    targets = ["q_proj", "v_proj", "down_proj"] if family == "llama" else ["query", "value", "output.dense"]
    task = "CAUSAL_LM" if family == "llama" else "SEQ_CLS"
    theirs = _peft_model(hf_model, targets, r=4, alpha=16, task_type=task)
    _randomize_adapters(theirs, seed=5)
    if family == "bert":  # the trained head travels as modules_to_save
        with torch.no_grad():
            theirs.base_model.model.classifier.modules_to_save["default"].weight.mul_(3.0)
    theirs.save_pretrained(tmp_path / "ad")
    ours = load_adapter(attnlab.load(base), tmp_path / "ad")
    assert len(adapter_modules(ours)) == (6 if family == "llama" else 8)
    ids = _ids()
    with torch.no_grad():
        a, b = ours(ids).logits, theirs(input_ids=ids).logits
    assert (a - b).abs().max().item() <= TOL


def test_zero_b_leaves_outputs_unchanged_and_merge_equals_unmerged(tmp_path):
    _, base = _hf_llama(tmp_path)
    ours = attnlab.load(base)
    ids = _ids()
    with torch.no_grad():
        before = ours(ids).logits
        apply_lora(ours, ["q", "k", "v", "o", "up", "gate", "down"], r=8, alpha=16)
        assert (ours(ids).logits - before).abs().max().item() == 0.0     # B = 0 at initialisation
        _randomize_adapters(ours)
        unmerged = ours(ids).logits
        merge_lora(ours)
        assert all(m.merged for m in adapter_modules(ours).values())
        merged = ours(ids).logits
        unmerge_lora(ours)
        again = ours(ids).logits
        merge_lora(ours, unload=True)
        plain = ours(ids).logits
    assert (unmerged - before).abs().max().item() > 1e-3
    assert (merged - unmerged).abs().max().item() <= TOL
    assert (again - unmerged).abs().max().item() <= TOL
    assert not adapter_modules(ours) and (plain - unmerged).abs().max().item() <= TOL
    # the unloaded model is a plain base model again: it saves in the HF layout and loads back the same
    attnlab.save(ours, tmp_path / "merged")
    with torch.no_grad():
        assert (attnlab.load(tmp_path / "merged")(ids).logits - unmerged).abs().max().item() <= TOL


def test_only_adapter_parameters_get_gradients(tmp_path):
    _, base = _hf_bert(tmp_path)
    ours = attnlab.load(base).train()
    apply_lora(ours, ["query", "value"], r=4, alpha=8, dropout=0.1)
    n = mark_only_adapters_trainable(ours, also=["classifier"])
    want = sum(p.numel() for name, p in ours.named_parameters() if "lora_" in name or name.startswith("classifier."))
    assert n == want and n < sum(p.numel() for p in ours.parameters()) // 10
    out = ours(_ids(), labels=torch.tensor([0, 2]))
    out.loss.backward()
    for name, p in ours.named_parameters():
        trainable = "lora_" in name or name.startswith("classifier.")
        assert (p.grad is not None) == trainable, name
    # B = 0 at the start, so only B gets a gradient signal through the product; A's is exactly zero
    assert any(p.grad.abs().sum() > 0 for name, p in ours.named_parameters() if "lora_B" in name)


def test_targets_by_hf_or_attnlab_name_and_regex(tmp_path):
    _, base = _hf_llama(tmp_path)
    a, b, c = attnlab.load(base), attnlab.load(base), attnlab.load(base)
    assert apply_lora(a, ["q_proj"]) == apply_lora(b, ["attn.q"]) == ["backbone.layers.0.attn.q", "backbone.layers.1.attn.q"]
    assert apply_lora(c, r"backbone\.layers\.1\.ffn\.(up|down)") == ["backbone.layers.1.ffn.up", "backbone.layers.1.ffn.down"]
    save_adapter(c, tmp_path / "ad")  # only layer 1: the saved suffixes must not catch layer 0's
    config = json.loads((tmp_path / "ad" / "adapter_config.json").read_text())
    assert config["target_modules"] == ["1.mlp.down_proj", "1.mlp.up_proj"]
    with pytest.raises(ValueError, match="no linear layer matches"):
        apply_lora(attnlab.load(base), ["nonexistent"])


def test_lora_roundtrip_through_attnlab_and_errors(tmp_path):
    _, base = _hf_bert(tmp_path)
    ours = attnlab.load(base)
    apply_lora(ours, ["query", "value"], r=4, alpha=8, rslora=True)
    _randomize_adapters(ours)
    save_adapter(ours, tmp_path / "ad", modules_to_save=["classifier"])
    again = load_adapter(attnlab.load(base), tmp_path / "ad", trainable=True)
    ids = _ids()
    with torch.no_grad():
        assert (ours(ids).logits - again(ids).logits).abs().max().item() <= TOL
    assert all(p.requires_grad == ("lora_" in n or n.startswith("classifier.")) for n, p in again.named_parameters())
    cfg = json.loads((tmp_path / "ad" / "adapter_config.json").read_text())
    cfg["use_dora"] = True
    (tmp_path / "ad" / "adapter_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="use_dora"):
        load_adapter(attnlab.load(base), tmp_path / "ad")
    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        load_adapter(attnlab.load(base), tmp_path)
    merge_lora(ours)
    with pytest.raises(ValueError, match="merged"):
        save_adapter(ours, tmp_path / "ad2")


def test_bottleneck_adapter_identity_at_init_grads_and_roundtrip(tmp_path):
    _, base = _hf_llama(tmp_path)
    ours = attnlab.load(base)
    ids = _ids()
    with torch.no_grad():
        before = ours(ids).logits
    chosen = apply_bottleneck(ours, size=8)
    assert len(chosen) == 4   # attention output + FFN output of 2 layers (Houlsby's placement)
    with torch.no_grad():
        assert (ours(ids).logits - before).abs().max().item() == 0.0
    n = mark_only_adapters_trainable(ours)
    assert n == 4 * (2 * 32 * 8 + 8 + 32)
    ours.train()
    ours(ids, labels=ids).loss.backward()
    assert all((p.grad is not None) == ("adapter_" in name) for name, p in ours.named_parameters())
    _randomize_adapters(ours)
    ours.eval()
    save_adapter(ours, tmp_path / "ad")
    again = load_adapter(attnlab.load(base), tmp_path / "ad")
    with torch.no_grad():
        a, b = ours(ids).logits, again(ids).logits
    assert (a - b).abs().max().item() <= TOL and (a - before).abs().max().item() > 1e-3


def test_wrapped_linear_keeps_base_names_and_storage():
    lin = torch.nn.Linear(6, 5)
    w = lin.weight
    wrapped = LoRALinear(lin, LoraSettings(r=2))
    assert wrapped.weight is w
    assert set(wrapped.state_dict()) == {"weight", "bias", "lora_A.weight", "lora_B.weight"}
