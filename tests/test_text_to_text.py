"""GLUE as T5 text-to-text (tasks/text_to_text.py, issue 23): prompts and label words per task, generated
strings mapped back to labels with unknown strings counted wrong, and a tiny T5 that learns to write the
right word, then is scored and used by `evaluate` / `predict` through the mapping saved with it."""
from __future__ import annotations

import json
import random

import pytest

from attnlab.cli import main
from attnlab.tasks.text_to_text import (FORMATS, finetune_text_to_text, parse, prompt, saved_format,
                                        score_strings, target, text_format)

TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "head_dim": 16, "intermediate_size": 64,
        "dropout": 0.0, "attention_dropout": 0.0}


def test_prompts_and_targets_per_task():
    assert prompt(text_format("sst2"), ["a fine film ."]) == "sst2 sentence: a fine film ."
    assert prompt(text_format("rte"), ["A cat sat.", "An animal sat."]) == \
        "rte sentence1: A cat sat. sentence2: An animal sat."
    assert prompt(text_format("mrpc"), ["a", "b"]).startswith("mrpc sentence1: a sentence2: b")
    assert prompt(text_format("cola"), ["x"]) == "cola sentence: x"
    assert [target(text_format("sst2"), label) for label in ("0", "1")] == ["negative", "positive"]
    assert target(text_format("cola"), "0") == "unacceptable"
    assert target(text_format("mrpc"), "1") == "equivalent"
    assert target(text_format("rte"), "not_entailment") == "not_entailment"
    # STS-B: the score rounded to the nearest 0.2, written with one decimal (T5 §2.4)
    assert [target(text_format("stsb"), s) for s in (3.77, 2.5, 0.0, 4.9, 5.0)] == ["3.8", "2.4", "0.0", "4.8", "5.0"]
    with pytest.raises(ValueError, match="label '7' has no word"):
        target(text_format("sst2"), "7")
    with pytest.raises(ValueError, match="conll2003"):
        text_format("conll2003")
    assert set(FORMATS) == {"sst2", "cola", "mrpc", "rte", "stsb"}


def test_strings_map_back_and_unknown_ones_count_wrong():
    sst2, stsb = text_format("sst2"), text_format("stsb")
    assert parse(sst2, " positive ") == "1" and parse(sst2, "negative") == "0"
    assert parse(sst2, "positively") is None and parse(sst2, "") is None
    assert parse(stsb, "3.8") == 3.8 and parse(stsb, "5.2") is None and parse(stsb, "three") is None
    gold = [{"label": label} for label in ("1", "0", "1", "0")]
    out = score_strings("sst2", sst2, gold, ["positive", "negative", "banana", "negative"])
    assert out["accuracy"] == 75.0 and out["unknown"] == 1 and out["unknown_examples"] == ["banana"]
    # F1 of "equivalent": an unknown string where the gold is 1 is a miss, never a hit
    mrpc = text_format("mrpc")
    out = score_strings("mrpc", mrpc, [{"label": "1"}, {"label": "1"}], ["equivalent", "equivalent!"])
    assert out["accuracy"] == 50.0 and out["unknown"] == 1 and round(out["f1"], 2) == 66.67
    # an unknown against a gold 0 is scored as a 1: wrong, even though "no paraphrase" was right
    out = score_strings("mrpc", mrpc, [{"label": "0"}, {"label": "1"}], ["???", "equivalent"])
    assert out["accuracy"] == 50.0 and out["unknown"] == 1
    pairs = [{"label": v} for v in (1.0, 2.0, 3.0, 4.0)]
    good = score_strings("stsb", stsb, pairs, ["1.0", "2.0", "3.0", "4.0"])
    bad = score_strings("stsb", stsb, pairs, ["1.0", "2.0", "3.0", "lots"])
    assert good["pearson"] == 100.0 and bad["pearson"] < 50 and bad["unknown"] == 1


def _toy(path, n, seed):
    """SST-2-format lines whose label is whether 'good' or 'bad' occurs among filler words."""
    rng = random.Random(seed)
    filler = "the a film plot actors story music was is and very quite".split()
    lines = ["sentence\tlabel"]
    for i in range(n):
        word, label = ("good", 1) if i % 2 else ("bad", 0)
        words = rng.sample(filler, 4)
        words.insert(rng.randrange(5), word)
        lines.append(f"{' '.join(words)}\t{label}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_tiny_t5_learns_to_write_the_label_word(tmp_path, capsys):
    train, valid = _toy(tmp_path / "train.tsv", 64, 0), _toy(tmp_path / "dev.tsv", 16, 1)
    out = tmp_path / "t5"
    summary = finetune_text_to_text("sst2", "t5-small", out, train_file=train, valid_file=valid, overrides=TINY,
                                    epochs=25, lr=3e-3, batch_size=16, vocab_size=200, progress=False, seed=0)
    assert summary["eval_accuracy"] == 100.0 and summary["eval_unknown"] == 0, summary
    assert saved_format(out) == text_format("sst2")   # the mapping travels with the model
    assert json.loads((out / "config.json").read_text())["architectures"] == ["T5ForConditionalGeneration"]
    # a saved checkpoint (Hugging Face's T5 layout) trains further with its own tokenizer
    again = finetune_text_to_text("sst2", out, tmp_path / "again", train_file=train, valid_file=valid, epochs=1,
                                  lr=1e-4, batch_size=16, progress=False, seed=0)
    assert again["eval_accuracy"] == 100.0 and again["vocab_size"] == summary["vocab_size"]
    assert main(["evaluate", "sst2", "--model", str(out), "--data", str(valid)]) == 0
    scored = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert scored["accuracy"] == 100.0 and scored["unknown"] == 0 and scored["examples"] == 16
    inputs = tmp_path / "in.txt"
    inputs.write_text("the plot was good and\nthe music was very bad\n")
    assert main(["predict", "sst2", "--model", str(out), "--input", str(inputs), "--output", str(tmp_path / "p.txt")]) == 0
    assert (tmp_path / "p.txt").read_text().split() == ["1", "0"]
    # the same model cannot be scored as another task: its mapping names sst2
    assert main(["evaluate", "cola", "--model", str(out), "--data", str(valid)]) == 1
    assert "trained as text-to-text for sst2, not cola" in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["finetune", "squad", "--text-to-text", "--model", "t5-small"], "task 'squad' has no text-to-text format"),
    (["finetune", "sst2", "--text-to-text", "--model", "bert-tiny"], "--model bert-tiny: a bert preset; --text-to-text needs a T5"),
])
def test_bad_task_or_model_is_one_line_and_status_2(argv, message, tmp_path, capsys):
    code = main([*argv, "--output", str(tmp_path / "o"), "--max-train-samples", "4", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and message in err, err


def test_encoder_checkpoint_is_refused(tmp_path, capsys):
    from attnlab.config import preset
    from attnlab.heads import SequenceClassification
    from attnlab.interop.native import save_model
    bert = SequenceClassification(preset("bert-tiny", hidden_size=32, num_layers=1, num_heads=2,
                                         intermediate_size=64, vocab_size=100))
    save_model(bert, tmp_path / "bert")
    code = main(["finetune", "sst2", "--text-to-text", "--model", str(tmp_path / "bert"), "--output",
                 str(tmp_path / "o"), "--max-train-samples", "4", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "needs an encoder-decoder" in err, err
