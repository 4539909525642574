"""Self-training on spans of the labeled sentences(attnlab/tasks/selftrain.py, finetune --self-train K):
the spans are seeded, distinct, contiguous and never a whole sentence; only the teacher's confident labels are
kept; a run trains a teacher, then a fresh model on the labeled examples plus the spans, and says so; without the
option (no default turns it on: it measured no gain) nothing of it runs."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

import attnlab
from attnlab.cli import main
from attnlab.config import ModelConfig
from attnlab.models.base import ModelOutput
from attnlab.tasks import defaults, selftrain
from attnlab.tasks.selftrain import confident_labels, random_spans
from test_fewlabel_rule import _sentence_transformer

TEXTS = ["a b c d e f g h i j", "one two three four five", "too short", "x y z w v u t s"]


def test_spans_are_seeded_distinct_contiguous_and_never_a_whole_sentence():
    spans = random_spans(TEXTS + ["one two three"], per_sentence=6, seed=3)
    assert spans == sorted(set(spans)) and spans == random_spans(TEXTS + ["one two three"], 6, seed=3)
    assert spans != random_spans(TEXTS, 6, seed=4)
    wholes = {" ".join(t.split()) for t in TEXTS} | {"one two three"}
    for span in spans:
        words = span.split()
        assert span not in wholes and len(words) >= 2
        host = [t for t in TEXTS if f" {span} " in f" {t} "]  # a contiguous run of a sentence's words
        assert host and any(len(words) <= round(0.9 * len(t.split())) for t in host), span
    assert not any(s in ("too", "short") or "short" in s for s in spans)  # fewer than 4 words: no spans
    assert random_spans(TEXTS, 0) == []
    with pytest.raises(ValueError, match="spans per sentence"):
        random_spans(TEXTS, -1)
    with pytest.raises(ValueError, match="span share"):
        random_spans(TEXTS, 2, share=(0.5, 1.0))


class _Fixed(torch.nn.Module):
    """A stand-in classifier whose logits for a sequence are given by its first token id."""
    def __init__(self, table):
        super().__init__()
        self.table = torch.tensor(table, dtype=torch.float)
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        return ModelOutput(logits=self.table[input_ids[:, 0]])


def test_only_the_teachers_confident_labels_are_kept():
    # first token 0: p(neg) = 0.95, 1: p(pos) = 0.73, 2: p(pos) = 0.98
    table = [[0.0, -2.944], [0.0, 1.0], [0.0, 3.9]]
    feats = [{"input_ids": [i, 5], "token_type_ids": [0, 0]} for i in (0, 1, 2, 1)]
    kept = confident_labels(_Fixed(table), feats, 9, ["neg", "pos"], threshold=0.9)
    assert [(i, label) for i, label, _ in kept] == [(0, "neg"), (2, "pos")]
    assert all(p >= 0.9 for _, _, p in kept)
    assert len(confident_labels(_Fixed(table), feats, 9, ["neg", "pos"], threshold=0.5)) == 4
    assert confident_labels(_Fixed(table), [], 9, ["neg", "pos"]) == []
    with pytest.raises(ValueError, match="confidence threshold"):
        confident_labels(_Fixed(table), feats, 9, ["neg", "pos"], threshold=0)


@pytest.fixture(scope="module")
def st_tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("st_tiny")
    torch.manual_seed(0)
    attnlab.from_config(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                                    dropout=0.0, attention_dropout=0.0)).save(out)
    attnlab.load_tokenizer("minilm").save(out)
    return _sentence_transformer(out)


def test_self_training_trains_a_teacher_then_a_fresh_model_on_its_confident_spans(
        st_tiny, data_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(defaults, "MIN_STEPS", 10)       # the schedule rule's path, not its length
    monkeypatch.setattr(selftrain, "CONFIDENCE", 0.5)    # a tiny teacher is never sure: keep every span
    lines = (data_dir / "glue/SST-2/train.tsv").read_text().splitlines()
    train = tmp_path / "train.tsv"
    train.write_text("\n".join(lines[:601]) + "\n")
    out = tmp_path / "out"
    assert main(["finetune", "sst2", "--model", str(st_tiny), "--train", str(train), "--output", str(out),
                 "--max-length", "32", "--no-progress", "--self-train", "3", "--lr", "3e-4", "--ema", "0.9",
                 "--seed", "7"]) == 0
    printed = capsys.readouterr()
    summary = json.loads(printed.out.strip().splitlines()[-1])
    info = summary["self_training"]
    assert summary["labeled_examples"] == 535 and summary["valid_examples"] == 60  # 10% held out (and 5 phrases of them), as without it
    assert info["spans_per_sentence"] == 3 and info["why"] == "--self-train 3"
    assert 0 < info["span_examples"] == info["spans"]  # at confidence 0.5 every span of two classes is kept
    assert summary["train_examples"] == 535 + info["span_examples"]
    teacher = json.loads((out / "teacher" / "metrics.json").read_text())
    assert teacher["train_examples"] == 535 and teacher["valid_examples"] == 60 and "self_training" not in teacher
    assert info["teacher_eval_accuracy"] == teacher["eval_accuracy"]
    for option, value in (("lr", 3e-4), ("ema", 0.9), ("seed", 7), ("max_length", 32)):  # the teacher ran as told
        assert teacher[option] == summary[option] == value, option
    assert "--self-train 3: first the teacher, a plain fine-tune of the 535 labeled examples" in printed.err
    assert f"train {summary['train_examples']} examples (535 labeled + {info['span_examples']} spans" in printed.err
    assert attnlab.load(out).config.classifier_pooling == "mean"  # the kept model is the student, in --output
    # no flag (no default turns it on) or --self-train 0: none of it runs (--teacher none: at 535 examples the
    # default rule would take the packaged LM teacher, another test's subject)
    for extra in ([], ["--self-train", "0"]):
        plain = tmp_path / "plain"
        assert main(["finetune", "sst2", "--model", str(st_tiny), "--train", str(train), "--output", str(plain),
                     "--max-length", "32", "--no-progress", "--teacher", "none", *extra]) == 0
        summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert "self_training" not in summary and summary["train_examples"] == 535
        assert not (plain / "teacher").exists()
        shutil.rmtree(plain)


def test_self_training_is_refused_where_it_cannot_run(st_tiny, tmp_path, capsys):
    for argv, message in [
        (["conll2003", "--self-train", "2"], "single-sentence classification"),
        (["sst2", "--self-train", "2", "--save-every", "5"], "it is two runs"),
        (["sst2", "--self-train", "2", "--from-scratch"], "pretrained weights"),
    ]:
        assert main(["finetune", *argv, "--model", str(st_tiny), "--output", str(tmp_path / "o"),
                     "--max-train-samples", "20", "--no-progress"]) == 1
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        main(["finetune", "sst2", "--model", str(st_tiny), "--output", str(tmp_path / "o"), "--self-train", "-1"])
    assert usage.value.code == 2 and "--self-train" in capsys.readouterr().err


def test_help_says_it_is_off_by_default_and_what_it_measured(capsys):
    """--help names the option, off by default; the defaults guide says what it measured."""
    from pathlib import Path
    with pytest.raises(SystemExit):
        main(["finetune", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--self-train K" in text and "(0: off)" in text
    guide = Path(__file__).resolve().parents[1] / "docs" / "guides" / "fine-tuning-defaults.md"
    text = " ".join(guide.read_text(encoding="utf-8").split())
    assert "**Self-training** - `--self-train K`" in text and "Off by default" in text
    assert "83.89" in text  # the plain fine-tune it was measured against
