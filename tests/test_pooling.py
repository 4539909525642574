"""The mean-pooling sequence classifier (config.classifier_pooling = "mean"): it ignores padding,
has no pooler, survives save/load in attnlab's own layout, is refused by the Hugging Face layout (which
would load it as a [CLS] + pooler classifier), and `finetune --pooling mean` trains and saves one."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab.cli import main
from attnlab.config import ConfigError, ModelConfig
from attnlab.heads import SequenceClassification, mean_pool


def _cfg(**kw) -> ModelConfig:
    return ModelConfig(vocab_size=100, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                       max_position_embeddings=32, dropout=0.0, attention_dropout=0.0, **kw)


def test_mean_pool_averages_the_real_tokens_only():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    assert torch.equal(mean_pool(hidden, torch.tensor([[1, 1, 0]])), torch.tensor([[2.0, 3.0]]))
    assert torch.equal(mean_pool(hidden, None), hidden.mean(1))


def test_a_mean_pooling_classifier_ignores_padding_and_has_no_pooler():
    torch.manual_seed(0)
    model = SequenceClassification(_cfg(classifier_pooling="mean")).eval()
    assert model.backbone.pooler is None and not any("pooler" in k for k in model.state_dict())
    ids = torch.tensor([[2, 17, 33, 41, 3]])
    padded = torch.cat([ids, torch.zeros(1, 3, dtype=torch.long)], 1)
    mask = torch.tensor([[1] * 5 + [0] * 3])
    with torch.no_grad():
        alone = model(input_ids=ids).logits
        with_pad = model(input_ids=padded, attention_mask=mask).logits
        unmasked = model(input_ids=padded).logits  # the pad tokens counted: a different vector
    torch.testing.assert_close(with_pad, alone, atol=1e-6, rtol=0)
    assert not torch.allclose(unmasked, alone, atol=1e-4)
    # and it is not the [CLS] classifier: the same weights read through the pooled [CLS] differ
    cls_model = SequenceClassification(_cfg())
    cls_model.load_state_dict(model.state_dict(), strict=False)
    with torch.no_grad():
        assert not torch.allclose(cls_model.eval()(input_ids=ids).logits, alone, atol=1e-4)


def test_unknown_pooling_is_a_config_error():
    with pytest.raises(ConfigError, match="classifier_pooling='max' is not one of cls, mean"):
        _cfg(classifier_pooling="max")


def test_the_switch_round_trips_through_save_and_load(tmp_path):
    torch.manual_seed(1)
    model = SequenceClassification(_cfg(classifier_pooling="mean", extra={"num_labels": 3})).eval()
    ids, mask = torch.tensor([[2, 5, 9, 3, 0]]), torch.tensor([[1, 1, 1, 1, 0]])
    attnlab.save(model, tmp_path / "auto")  # the HF layout cannot say "mean": attnlab's own layout
    assert (tmp_path / "auto" / "attnlab_config.json").exists() and not (tmp_path / "auto" / "config.json").exists()
    back = attnlab.load(tmp_path / "auto")
    assert isinstance(back, SequenceClassification) and back.config.classifier_pooling == "mean"
    with torch.no_grad():
        torch.testing.assert_close(back(input_ids=ids, attention_mask=mask).logits,
                                   model(input_ids=ids, attention_mask=mask).logits, atol=0, rtol=0)
    # the Hugging Face layout is refused with the switch named, rather than written as a [CLS] classifier
    with pytest.raises(ConfigError, match="classifier_pooling='mean'"):
        attnlab.save(model, tmp_path / "hf", layout="hf")
    # the [CLS] classifier still saves in the Hugging Face layout, the switch left out of config.json
    attnlab.save(SequenceClassification(_cfg()), tmp_path / "cls")
    hf = json.loads((tmp_path / "cls" / "config.json").read_text())
    assert "classifier_pooling" not in hf and attnlab.load(tmp_path / "cls").config.classifier_pooling == "cls"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A 2-layer, 64-wide BERT with MiniLM's tokenizer, saved with a pooler."""
    out = tmp_path_factory.mktemp("tiny")
    attnlab.from_config(ModelConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128,
                                    dropout=0.0, attention_dropout=0.0)).save(out)
    attnlab.load_tokenizer("minilm").save(out)
    return out


def _sst2_file(path: Path, n: int = 60) -> Path:
    lines = [f"review {i} of the film says it is {'great' if i % 2 else 'dull'}\t{i % 2}" for i in range(n)]
    path.write_text("sentence\tlabel\n" + "\n".join(lines) + "\n")
    return path


def test_finetune_pooling_mean_trains_saves_and_evaluates(tiny, tmp_path, capsys):
    train, out = _sst2_file(tmp_path / "t.tsv"), tmp_path / "o"
    assert main(["finetune", "sst2", "--model", str(tiny), "--output", str(out), "--train", str(train),
                 "--valid", str(train), "--epochs", "1", "--pooling", "mean", "--no-progress"]) == 0
    printed = capsys.readouterr()
    summary = json.loads(printed.out)
    assert summary["pooling"] == "mean" and ", mean pooling" in printed.err
    tuned = attnlab.load(out)
    assert tuned.config.classifier_pooling == "mean" and tuned.backbone.pooler is None
    assert main(["evaluate", "sst2", "--model", str(out), "--data", str(train)]) == 0
    assert json.loads(capsys.readouterr().out)["accuracy"] == pytest.approx(summary["eval_accuracy"], abs=1e-3)
    # fine-tuning the fine-tuned model again keeps its pooling without the flag
    again = tmp_path / "again"
    assert main(["finetune", "sst2", "--model", str(out), "--output", str(again), "--train", str(train),
                 "--valid", str(train), "--epochs", "1", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["pooling"] == "mean"


def test_pooling_is_refused_for_a_token_task(tiny, tmp_path):
    with pytest.raises(ValueError, match="pooling applies to sentence classification"):
        from attnlab.tasks.finetune import finetune
        finetune("conll2003", tiny, tmp_path / "o", pooling="mean")


def test_fit_logistic_separates_separable_data_and_matches_the_l2_optimum():
    from attnlab.tasks.probe import fit_logistic
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 5, generator=g)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    w, b = fit_logistic(x, y, 2)
    assert ((x @ w.T + b).argmax(-1) == y).float().mean() > 0.97
    # at the optimum the gradient of the penalised objective vanishes
    w_, b_ = w.clone().requires_grad_(), b.clone().requires_grad_()
    loss = torch.nn.functional.cross_entropy(x @ w_.T + b_, y) + w_.pow(2).sum() / (2 * len(x))
    loss.backward()
    assert w_.grad.abs().max() < 1e-3 and b_.grad.abs().max() < 1e-3


def test_probe_init_puts_the_probe_into_the_classifier(tiny):
    from attnlab.tasks import get_task
    from attnlab.tasks.finetune import load_for_task
    from attnlab.tasks.probe import probe_init, sentence_vectors
    task, tok = get_task("sst2"), attnlab.load_tokenizer(tiny)
    examples = [{"texts": [f"a {'good' if i % 2 else 'bad'} film number {i}"], "label": str(i % 2), "source": "t", "line": i} for i in range(40)]
    net = load_for_task(task, tiny, task.model_extra(["0", "1"]), "mean")
    feats = task.features(examples, tok, 32, {"0": 0, "1": 1}, training=True)
    fit = probe_init(net, feats, tok.pad_token_id)
    assert fit > 90  # "good" vs "bad" is linear even in a random tiny model's mean vectors
    x = sentence_vectors(net, feats, tok.pad_token_id)
    from attnlab.tasks.common import collate
    batch = collate(feats[:4], tok.pad_token_id)
    with torch.no_grad():
        logits = net.eval()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                            token_type_ids=batch["token_type_ids"]).logits
    torch.testing.assert_close(logits, net.classifier(x[:4]), atol=1e-5, rtol=1e-5)
