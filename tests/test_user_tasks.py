"""Tasks named for what the user brings: a user's own CSV / TSV / JSONL files with any label names fine-tune,
the label names travel with the model (config id2label) and come back from `predict`; regression on floats;
token tags from JSONL; errors name the file, the line and the column; no data root means "pass --train"."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab.cli import main
from attnlab.config import ModelConfig
from attnlab.tasks import DataError, evaluate, get_task
from attnlab.tasks.user import with_columns

SPAM = ["win a free prize now", "cheap pills click here", "you won cash claim today", "free money offer",
        "click to claim your reward", "free cash prize click"]
HAM = ["see you at lunch tomorrow", "the meeting moved to friday", "can you send the report",
       "thanks for dinner last night", "call me when you land", "lunch on friday with the team"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A 2-layer, 64-wide BERT with MiniLM's tokenizer: trains in seconds."""
    out = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)  # the same starting weights every run: what the tests learn does not vary
    model = attnlab.from_config(ModelConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128,
                                            dropout=0.0, attention_dropout=0.0))
    model.save(out)
    attnlab.load_tokenizer("minilm").save(out)
    return out


def _fit(tiny, task: str, train: Path, out: Path, *extra: str) -> dict:
    assert main(["finetune", task, "--model", str(tiny), "--train", str(train), "--output", str(out),
                 "--epochs", "12", "--lr", "2e-3", "--batch-size", "8", "--max-length", "16", "--no-progress",
                 *extra]) == 0
    return json.loads((out / "metrics.json").read_text())


def test_spam_ham_csv_labels_come_back_by_name(tiny, tmp_path, capsys):
    rng = random.Random(0)
    rows = [(rng.choice(SPAM if i % 2 else HAM), "spam" if i % 2 else "ham") for i in range(40)]
    rows = [(f'"{t}, ok"' if i % 4 < 2 else t, l) for i, (t, l) in enumerate(rows)]  # CSV quoting, both classes
    train = tmp_path / "own.csv"
    train.write_text("text,label\n" + "".join(f"{t},{l}\n" for t, l in rows), encoding="utf-8")
    summary = _fit(tiny, "text-classification", train, tmp_path / "m")
    assert summary["task"] == "text-classification" and summary["train_examples"] + summary["valid_examples"] == 40
    assert {"eval_accuracy", "eval_macro_f1"} <= set(summary)
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["id2label"] == {"0": "ham", "1": "spam"}

    inputs = tmp_path / "in.txt"
    inputs.write_text("cheap pills click here\nthe meeting moved to friday\n")
    assert main(["predict", "text-classification", "--model", str(tmp_path / "m"), "--input", str(inputs),
                 "--output", str(tmp_path / "pred.txt")]) == 0
    assert (tmp_path / "pred.txt").read_text().split() == ["spam", "ham"]  # learned, and named as in the file

    # the training file itself (a CSV with a header) is accepted as input and scored by evaluate
    capsys.readouterr()
    assert main(["evaluate", "text-classification", "--model", str(tmp_path / "m"), "--data", str(train)]) == 0
    assert json.loads(capsys.readouterr().out)["accuracy"] >= 90


def test_jsonl_three_labels_named_columns(tiny, tmp_path):
    words = {"sport": ["goal", "match", "team", "league"], "food": ["pasta", "soup", "bread", "cheese"],
             "tech": ["laptop", "python", "server", "chip"]}
    rng = random.Random(1)
    train = tmp_path / "topics.jsonl"
    with open(train, "w", encoding="utf-8") as fh:
        for i in range(48):
            topic = list(words)[i % 3]
            fh.write(json.dumps({"id": i, "body": " ".join(rng.sample(words[topic], 3)), "topic": topic}) + "\n")
    summary = _fit(tiny, "text-classification", train, tmp_path / "m", "--text-column", "body",
                   "--label-column", "topic")
    assert "eval_macro_f1" in summary
    fitted = evaluate(with_columns(get_task("text-classification"), text="body", label="topic"), tmp_path / "m", train)
    assert fitted["examples"] == 48 and fitted["accuracy"] >= 80  # the topics were learned
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["id2label"] == {"0": "food", "1": "sport", "2": "tech"}
    inputs = tmp_path / "in.jsonl"
    inputs.write_text('{"body": "soup and bread"}\n{"body": "python server"}\n')
    assert main(["predict", "text-classification", "--model", str(tmp_path / "m"), "--input", str(inputs),
                 "--output", str(tmp_path / "pred.txt"), "--text-column", "body"]) == 0
    assert (tmp_path / "pred.txt").read_text().split() == ["food", "tech"]


def test_regression_on_float_scores_with_pairs(tiny, tmp_path):
    rng = random.Random(2)
    lines = []
    for _ in range(40):
        a, b = rng.sample(SPAM + HAM, 2)
        lines.append(f"{a}\t{b}\t{rng.uniform(0, 5):.2f}")
    train = tmp_path / "sts.tsv"
    train.write_text("sentence1\tsentence2\tscore\n" + "\n".join(lines) + "\n")
    summary = _fit(tiny, "regression", train, tmp_path / "m", "--epochs", "2")
    assert {"eval_pearson", "eval_spearman"} <= set(summary)
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["problem_type"] == "regression" and config["num_labels"] == 1
    examples = get_task("regression").read(train)
    assert examples[0]["texts"] == lines[0].split("\t")[:2] and isinstance(examples[0]["label"], float)
    inputs = tmp_path / "pairs.txt"
    inputs.write_text("free money offer\tsee you at lunch tomorrow\n")
    assert main(["predict", "regression", "--model", str(tmp_path / "m"), "--input", str(inputs),
                 "--output", str(tmp_path / "pred.txt")]) == 0
    float((tmp_path / "pred.txt").read_text().strip())  # a score, not a label name


def test_token_classification_jsonl(tiny, tmp_path):
    rng = random.Random(3)
    names, cities = ["anna", "omar", "li", "sara"], ["paris", "lima", "oslo", "cairo"]
    train = tmp_path / "ner.jsonl"
    with open(train, "w", encoding="utf-8") as fh:
        for _ in range(40):
            n, c = rng.choice(names), rng.choice(cities)
            fh.write(json.dumps({"tokens": [n, "lives", "in", c], "tags": ["B-PER", "O", "O", "B-LOC"]}) + "\n")
    summary = _fit(tiny, "token-classification", train, tmp_path / "m")
    assert {"eval_f1", "eval_accuracy"} <= set(summary)
    inputs = tmp_path / "in.jsonl"
    inputs.write_text('{"tokens": ["sara", "lives", "in", "oslo"]}\n')
    assert main(["predict", "token-classification", "--model", str(tmp_path / "m"), "--input", str(inputs),
                 "--output", str(tmp_path / "pred.txt")]) == 0
    assert (tmp_path / "pred.txt").read_text().split() == ["sara", "B-PER", "lives", "O", "in", "O", "oslo", "B-LOC"]


def test_column_detection_and_label_order(tmp_path):
    f = tmp_path / "x.csv"
    f.write_text("Sentence,Label\nhello,10\nbye,2\nok,2\n")
    task = get_task("text-classification")
    examples = task.read(f)
    assert [e["texts"] for e in examples] == [["hello"], ["bye"], ["ok"]] and examples[0]["line"] == 2
    assert task.label_list(examples) == ["2", "10"]  # integer labels in numeric order
    pair = with_columns(task, pair="Label")
    assert pair.read(f)[0]["texts"] == ["hello", "10"] and pair.columns == (0, 1)
    j = tmp_path / "x.jsonl"
    j.write_text('{"text": "a", "label": 1}\n\n{"text": "b", "label": 1.0}\n{"text": "c", "label": true}\n')
    assert [e["label"] for e in task.read(j)] == ["1", "1", "True"]


@pytest.mark.parametrize("name,content,task,message", [
    ("a.csv", "text,label\nfine,1\nshort\n", "text-classification", "a.csv:3: 1 field(s), but the header row has 2"),
    ("b.csv", "words,y\nfine,1\n", "text-classification", "none of the columns words, y is one of text"),
    ("c.tsv", "text\tscore\nfine\t1.5\nbad\thigh\n", "regression", "c.tsv:3: column 'score': 'high' is not a number"),
    ("d.jsonl", '{"text": "x", "label": "a"}\n{"text": "y", "label": \n', "text-classification",
     "d.jsonl:2: not valid JSON (column"),
    ("e.jsonl", '{"text": "x", "label": ""}\n', "text-classification", "e.jsonl:1: column 'label' (the label) is empty"),
    ("f.jsonl", '{"tokens": ["a", "b"], "tags": ["O"]}\n', "token-classification",
     "f.jsonl:1: 'tags' must be a list of 2 tags"),
    ("g.tsv", "sentence1\tlabel\nx\t1\n", "sentence-pair-classification", "name it with --text-pair-column"),
])
def test_errors_name_file_line_and_column(tmp_path, name, content, task, message):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(DataError, match=None) as err:
        get_task(task).read(path)
    assert message in str(err.value)


def test_named_column_must_exist(tmp_path):
    f = tmp_path / "x.csv"
    f.write_text("text,label\nhi,a\n")
    with pytest.raises(DataError, match=r"x.csv: no column 'body' \(--text-column\); the columns are text, label"):
        with_columns(get_task("text-classification"), text="body").read(f)


def test_presets_refuse_column_options(capsys):
    assert main(["finetune", "sst2", "--model", "minilm", "--output", "unused", "--text-column", "a"]) == 1
    assert "sst2: --text-column is for the tasks that read the user's columns" in capsys.readouterr().err


def test_no_train_file_says_pass_train(monkeypatch, tmp_path, capsys):
    from attnlab.data import root
    from attnlab.tasks.splits import resolve_files
    with pytest.raises(DataError, match="text-classification: no training file: pass --train FILE$"):
        resolve_files(get_task("text-classification"))
    # an installed package: no ATTNLAB_DATA, no checkout beside it -> no data root, presets need --train too
    monkeypatch.delenv("ATTNLAB_DATA", raising=False)
    monkeypatch.setattr(root, "__file__", str(tmp_path / "site-packages" / "attnlab" / "data" / "root.py"))
    assert root.data_root() is None
    with pytest.raises(DataError, match=r"sst2: no training file: pass --train FILE \(or set ATTNLAB_DATA\)"):
        resolve_files(get_task("sst2"))
    with pytest.raises(FileNotFoundError, match=r"data.files: \$\{ATTNLAB_DATA\}/x/\*.txt uses"):
        from attnlab.training.pretrain import _expand
        _expand("${ATTNLAB_DATA}/x/*.txt")
    assert main(["finetune", "mrpc", "--model", "minilm", "--output", str(tmp_path / "o")]) == 1
    assert "mrpc: no training file: pass --train FILE (or set ATTNLAB_DATA)" in capsys.readouterr().err
    monkeypatch.setenv("ATTNLAB_DATA", str(tmp_path))
    assert root.data_root() == tmp_path
    assert resolve_files(get_task("mrpc"))[0] == str(tmp_path / "glue/MRPC/train.tsv")


def test_question_answering_needs_user_file_and_reads_squad(tmp_path):
    squad = {"data": [{"paragraphs": [{"context": "Oslo is the capital of Norway.",
                                        "qas": [{"id": "q1", "question": "What is the capital of Norway?",
                                                 "answers": [{"text": "Oslo", "answer_start": 0}]}]}]}]}
    f = tmp_path / "qa.json"
    f.write_text(json.dumps(squad))
    task = get_task("question-answering")
    assert task.train_file is None and task.read(f)[0]["answers"][0]["text"] == "Oslo"
