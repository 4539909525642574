"""Model soups (training/soup.py, `attnlab soup`): the weights' uniform average, checked against a hand-made
average; what cannot be averaged is refused by name; the saved soup loads and scores as the averaged model."""
from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab.cli import main
from attnlab.config import ModelConfig
from attnlab.training.soup import average_state_dicts, soup

CFG = dict(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, dropout=0.0, attention_dropout=0.0)


def test_average_is_the_mean_and_refuses_what_it_cannot_average():
    a = {"w": torch.tensor([1.0, 2.0]), "h": torch.tensor([0.5], dtype=torch.bfloat16), "step": torch.tensor(3)}
    b = {"w": torch.tensor([3.0, 6.0]), "h": torch.tensor([1.5], dtype=torch.bfloat16), "step": torch.tensor(3)}
    avg = average_state_dicts([a, b])
    assert torch.equal(avg["w"], torch.tensor([2.0, 4.0])) and avg["h"].dtype == torch.bfloat16
    assert avg["h"].item() == 1.0 and avg["step"].item() == 3
    with pytest.raises(ValueError, match=r"run-b: step .* differs"):
        average_state_dicts([a, {**b, "step": torch.tensor(4)}], ["run-a", "run-b"])
    with pytest.raises(ValueError, match=r"run-b: w has shape \(3,\), run-a's \(2,\)"):
        average_state_dicts([a, {**b, "w": torch.zeros(3)}], ["run-a", "run-b"])
    with pytest.raises(ValueError, match=r"run-b: .*missing \['h'\]"):
        average_state_dicts([a, {"w": b["w"], "step": b["step"]}], ["run-a", "run-b"])
    with pytest.raises(ValueError, match="at least one"):
        average_state_dicts([])


def test_average_streams_and_leaves_its_inputs_alone():
    # `soup` feeds a generator (one run loaded at a time); a float64 input must not become the running sum
    first = {"w": torch.tensor([1.0, 2.0], dtype=torch.float64)}
    made = []

    def runs():
        for scale in (1.0, 2.0, 3.0):
            made.append(scale)
            yield first if scale == 1.0 else {"w": first["w"] * scale}

    avg = average_state_dicts(runs())
    assert made == [1.0, 2.0, 3.0] and torch.equal(avg["w"], torch.tensor([2.0, 4.0], dtype=torch.float64))
    assert torch.equal(first["w"], torch.tensor([1.0, 2.0], dtype=torch.float64))


def _classifiers(tmp_path, seeds, **over):
    dirs = []
    for seed in seeds:
        torch.manual_seed(seed)
        model = attnlab.from_config(ModelConfig(**{**CFG, **over}), architecture="BertForSequenceClassification")
        out = tmp_path / f"run-{seed}-{len(over)}"
        attnlab.save(model, out)
        attnlab.load_tokenizer("minilm").save(out)
        dirs.append(out)
    return dirs


def test_the_saved_soup_is_the_averaged_model(tmp_path):
    dirs = _classifiers(tmp_path, (0, 1, 2))
    models = [attnlab.load(d).eval() for d in dirs]
    assert main(["soup", *map(str, dirs), "--output", str(tmp_path / "soup")]) == 0
    souped = attnlab.load(tmp_path / "soup").eval()
    assert (tmp_path / "soup" / "vocab.txt").exists()           # the tokenizer goes with it
    for key, value in souped.state_dict().items():
        want = sum(m.state_dict()[key] for m in models) / 3
        torch.testing.assert_close(value, want, atol=1e-6, rtol=1e-6)
    ids = torch.tensor([[101, 2023, 3185, 102]])
    with torch.no_grad():   # and the soup is no model it came from
        assert not torch.allclose(souped(ids).logits, models[0](ids).logits)
    # a soup of one model with itself is that model
    twice = soup([dirs[1], dirs[1]], tmp_path / "same")
    with torch.no_grad():
        torch.testing.assert_close(twice.eval()(ids).logits, models[1](ids).logits, atol=1e-6, rtol=1e-6)


def test_runs_of_other_models_are_refused_by_name(tmp_path):
    base = _classifiers(tmp_path, (0,))[0]
    wider = _classifiers(tmp_path, (1,), intermediate_size=128)[0]
    with pytest.raises(ValueError, match=f"{wider}'s config differs .* intermediate_size"):
        soup([base, wider], tmp_path / "bad")
    assert main(["soup", str(base), "--output", str(tmp_path / "one")]) == 1    # one model: nothing to average
