"""LoRA through the command line: `attnlab finetune TASK --lora r=...` (a tiny real fine-tune), and
`--adapter DIR` for `generate` and `serve`."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab.cli import main
from attnlab.config import ModelConfig
from attnlab.inference.generate import generate
from attnlab.interop.peft import load_adapter, merged_copy, save_adapter
from attnlab.nn.lora import adapter_modules, parse_lora_spec

from _adapt import smol_tokenizer, tiny_llama_config


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    model = attnlab.from_config(ModelConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128,
                                            dropout=0.0, attention_dropout=0.0))
    model.save(out)
    attnlab.load_tokenizer("minilm").save(out)
    return out


def test_finetune_with_lora_trains_only_the_adapter_and_head(tiny_bert, data_dir, tmp_path, capsys):
    out = tmp_path / "sst2"
    rc = main(["finetune", "sst2", "--model", str(tiny_bert), "--output", str(out), "--lora", "r=4,alpha=8,targets=q+v+ffn.up",
               "--train", str(data_dir / "glue/SST-2/train.tsv"), "--max-train-samples", "200", "--max-eval-samples", "50",
               "--epochs", "1", "--lr", "1e-3", "--batch-size", "16", "--max-length", "32", "--no-progress"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    # 2 layers x 3 targets x r(64 + out) + classifier (64*2 + 2)
    want = 2 * (4 * (64 + 64) * 2 + 4 * (64 + 128)) + 64 * 2 + 2
    assert summary["trainable_parameters"] == want and summary["lora"]["r"] == 4
    config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert config["task_type"] == "SEQ_CLS" and config["modules_to_save"] == ["classifier"]
    assert config["target_modules"] == ["intermediate.dense", "query", "value"]
    # the base model with the adapter computes what the merged model written to OUTPUT computes
    base = attnlab.load(tiny_bert, architecture="BertForSequenceClassification",
                        extra={"id2label": {"0": "0", "1": "1"}, "label2id": {"0": 0, "1": 1}})
    adapted, merged = load_adapter(base, out / "adapter"), attnlab.load(out)
    assert len(adapter_modules(adapted)) == 6 and not adapter_modules(merged)
    ids = torch.tensor([[101, 2023, 3185, 2003, 2307, 102]])
    with torch.no_grad():
        assert (adapted(ids).logits - merged(ids).logits).abs().max().item() <= 1e-5
    lines = (data_dir / "glue/SST-2/train.tsv").read_text(encoding="utf-8").splitlines()[:41]
    (tmp_path / "few.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["evaluate", "sst2", "--model", str(out), "--data", str(tmp_path / "few.tsv")]) == 0
    assert json.loads(capsys.readouterr().out)["examples"] == 40


def test_lora_spec_parsing_and_errors():
    assert parse_lora_spec("r=8") == {"r": 8, "alpha": 16.0}
    assert parse_lora_spec("r=4,alpha=4,dropout=0.1,targets=query+value") == \
        {"r": 4, "alpha": 4.0, "dropout": 0.1, "targets": ["query", "value"]}
    for bad, msg in (("alpha=4", "rank r is required"), ("r=x", "not a number"), ("r=4,rank=2", "KEY=VALUE"),
                     ("r=0", "positive integer"), ("r=4,dropout=1.5", "dropout")):
        with pytest.raises(ValueError, match=msg):
            parse_lora_spec(bad)
    assert main(["finetune", "translation", "--output", "/tmp/x", "--lora", "r=4"]) == 1


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    tok = smol_tokenizer()
    torch.manual_seed(0)
    cfg = tiny_llama_config(len(tok), max_position_embeddings=256, eos_token_id=2)
    out = tmp_path_factory.mktemp("llama")
    model = attnlab.from_config(cfg).eval()
    attnlab.save(model, out / "base")
    tok.save(out / "base")
    return out, tok, _saved_lora(model, ["q_proj", "v_proj", "down_proj"], 4, 1, out / "adapter")


def _saved_lora(model, targets: list[str], r: int, seed: int, directory: Path):
    """A LoRA with random (nonzero) B as well as A on `targets`, saved to `directory`; returns the merged model."""
    from attnlab.interop.peft import apply_lora
    apply_lora(model, targets, r=r, alpha=2 * r)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    save_adapter(model, directory)
    return merged_copy(model).eval()


def test_generate_with_adapter_equals_the_merged_model(tiny_llama, capsys):
    out, tok, merged = tiny_llama
    assert main(["generate", str(out / "base"), "--prompt", "Once upon a time", "--max-new-tokens", "8",
                 "--adapter", str(out / "adapter")]) == 0
    text = capsys.readouterr().out
    ids = tok.encode("Once upon a time", add_special_tokens=False)
    want = generate(merged, torch.tensor([ids]), max_new_tokens=8)[0, len(ids):].tolist()
    want = want[:want.index(2)] if 2 in want else want
    assert text == "Once upon a time" + tok.decode(want) + "\n" or text == tok.decode(want) + "\n"


def test_serve_applies_the_adapter(tiny_llama, monkeypatch):
    import attnlab.serve.app as app_module
    import attnlab.serve.drain as drain
    out, _, merged = tiny_llama
    seen = {}
    monkeypatch.setattr(app_module, "create_app", lambda model, tok, **kw: seen.setdefault("model", model))
    monkeypatch.setattr(drain, "run_server", lambda app, **kw: None)
    try:
        assert main(["serve", str(out / "base"), "--adapter", str(out / "adapter")]) == 0
    finally:
        torch.set_grad_enabled(True)  # `serve` turns autograd off process-wide; later tests train
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        assert (seen["model"](ids).logits - merged(ids).logits).abs().max().item() <= 1e-5


def test_serve_several_named_adapters_over_one_base(tiny_llama, monkeypatch):
    """`serve --adapter a=DIR --adapter b=DIR`: each adapter is a model over the base's own weight tensors
    (unmerged), equal to its merged copy; the base model stays itself; the request's "model" picks the engine,
    an unknown name is a 404 naming it."""
    from starlette.testclient import TestClient

    import attnlab.serve.app as app_module
    import attnlab.serve.drain as drain
    out, tok, merged_a = tiny_llama
    merged_b = _saved_lora(attnlab.load(out / "base").eval(), ["k_proj", "up_proj"], 2, 2, out / "adapter2")
    base_ref = attnlab.load(out / "base").eval()
    seen = {}
    monkeypatch.setattr(app_module, "create_app", lambda model, tok, **kw: seen.update(model=model, **kw))
    monkeypatch.setattr(drain, "run_server", lambda app, **kw: None)
    try:
        assert main(["serve", str(out / "base"), "--name", "tiny", "--adapter", f"a={out / 'adapter'}",
                     "--adapter", f"b={out / 'adapter2'}"]) == 0
        for bad in ([f"a={out / 'adapter'}", str(out / "adapter2")], [f"a={out / 'adapter'}", f"a={out / 'adapter2'}"]):
            with pytest.raises(SystemExit, match="distinct names"):
                main(["serve", str(out / "base"), *[x for a in bad for x in ("--adapter", a)]])
    finally:
        torch.set_grad_enabled(True)  # `serve` turns autograd off process-wide; later tests train
    base, views = seen["model"], seen["adapters"]
    assert set(views) == {"a", "b"}
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        for got, want in ((base, base_ref), (views["a"], merged_a), (views["b"], merged_b)):
            assert (got(ids).logits - want(ids).logits).abs().max().item() <= 1e-5
    shared = base.backbone.layers[0].attn.q.weight
    assert views["a"].backbone.layers[0].attn.q.weight is shared is views["b"].backbone.layers[0].attn.q.weight

    monkeypatch.undo()
    app = app_module.create_app(base, tok, name="tiny", adapters=views, allowed_hosts=["testserver"])  # TestClient
    prompt = "Once upon a time"
    p_ids = tok.encode(prompt, add_special_tokens=False)

    def reference(model):
        new = generate(model, torch.tensor([p_ids]), max_new_tokens=6)[0, len(p_ids):].tolist()
        return tok.decode(new[:new.index(2)] if 2 in new else new)
    with TestClient(app) as client:
        for name, model in ((None, base_ref), ("tiny", base_ref), ("a", merged_a), ("b", merged_b)):
            body = {"prompt": prompt, "max_tokens": 6, "temperature": 0, **({"model": name} if name else {})}
            r = client.post("/v1/completions", json=body)
            assert r.status_code == 200 and r.json()["model"] == (name or "tiny")
            assert r.json()["choices"][0]["text"] == reference(model), name
        r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2, "model": "c"})
        assert r.status_code == 404
        err = r.json()["error"]
        assert err["param"] == "model" and "'c'" in err["message"] and "tiny, a, b" in err["message"]
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["tiny", "a", "b"]
        assert client.get("/metrics").json()["server"]["adapters"] == ["a", "b"]


def test_adapter_view_refuses_an_adapter_that_saves_whole_modules(tiny_llama, tmp_path):
    """Loading a saved head into a view would overwrite the weights the base model and every other view share."""
    import shutil

    from safetensors.torch import load_file, save_file

    from attnlab.interop.peft import adapter_view
    out, _, _ = tiny_llama
    shutil.copytree(out / "adapter", tmp_path / "with-head")
    weights = tmp_path / "with-head" / "adapter_model.safetensors"
    tensors = load_file(str(weights))
    save_file({**tensors, "base_model.model.lm_head.weight": torch.zeros(3, 3)}, str(weights))
    base = attnlab.load(out / "base")
    before = base.lm_head.weight.clone()
    with pytest.raises(ValueError, match="saves whole modules .lm_head.weight"):
        adapter_view(base, tmp_path / "with-head")
    assert torch.equal(base.lm_head.weight, before) and not adapter_modules(base)
