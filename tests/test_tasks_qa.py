"""SQuAD reading (bad offsets skipped and counted), windows with doc stride, answer positions that
decode back to the answer text, n-best span search, and the official EM/F1 normalisation."""
from __future__ import annotations

import json

import pytest
import torch

import attnlab
from attnlab.tasks import get_task
from attnlab.tasks.qa import exact_match, normalize_answer, read_squad, squad_scores, token_f1


def _squad(tmp_path, qas, context="The cat sat on the mat in Paris."):
    f = tmp_path / "q.json"
    f.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": [
        {"context": context, "qas": qas}]}]}))
    return f


def test_reads_real_dev(data_dir):
    examples, skipped = read_squad(data_dir / "squad/dev.json")
    assert len(examples) == 1953 and not skipped


def test_bad_answer_start_is_skipped_and_counted(tmp_path):
    f = _squad(tmp_path, [
        {"id": "ok", "question": "Where?", "answers": [{"text": "Paris", "answer_start": 26}]},
        {"id": "bad", "question": "What sat?", "answers": [{"text": "cat", "answer_start": 0}]}])
    examples, skipped = read_squad(f)
    assert [e["id"] for e in examples] == ["ok"] and skipped == ["bad"]
    with pytest.warns(UserWarning, match=r"skipped 1 question\(s\) whose answer_start does not match .* bad"):
        assert len(get_task("squad").read(f)) == 1


def test_windows_cover_long_contexts_and_positions_decode_to_the_answer(data_dir):
    task = get_task("squad")
    tok = attnlab.load_tokenizer("minilm")
    examples = task.read(data_dir / "squad/dev.json")[:300]
    feats = task.features(examples, tok, 128, None, training=True)
    assert len(feats) > len(examples)  # contexts longer than one window are split
    found = set()
    for f in feats:
        assert len(f["input_ids"]) <= 128
        if f["start_positions"]:
            ex = examples[f["example"]]
            i, j = f["start_positions"] - f["context_start"], f["end_positions"] - f["context_start"]
            text = ex["context"][f["offsets"][i][0]:f["offsets"][j][1]]
            assert normalize_answer(ex["answers"][0]["text"]) in normalize_answer(text)
            found.add(f["example"])
    assert len(found) >= 0.97 * len(examples)  # every answer lies whole in some window (bar odd tokens)


class _Spans(torch.nn.Module):
    """Scores the gold start/end of each window highest: the span search must return the answer."""
    hf_architecture = "BertForQuestionAnswering"

    def __init__(self, feats):
        super().__init__()
        from attnlab.config import ModelConfig
        self.config = ModelConfig()
        self.table = {tuple(f["input_ids"]): (f["start_positions"], f["end_positions"]) for f in feats}

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        out = torch.zeros(*input_ids.shape, 2)
        for row, ids in enumerate(input_ids.tolist()):
            s, e = self.table[tuple(i for i, m in zip(ids, attention_mask[row].tolist()) if m)]
            if s:
                out[row, s, 0] = out[row, e, 1] = 10.0
            out[row, 1, 1] = 30.0  # an end before any start: must be ignored, never decoded
        return type("O", (), {"logits": out})()


def test_span_search_recovers_answers(data_dir, tmp_path):
    task = get_task("squad")
    tok = attnlab.load_tokenizer("minilm")
    examples = task.read(data_dir / "squad/dev.json")[:100]
    feats = task.features(examples, tok, 192, None, training=True)
    preds = task.predict(_Spans(feats), tok, examples, 192)
    # the misses are sub-word answers in the data (gold "ks" inside "networks"): tokens cannot split them
    assert task.score(examples, preds)["exact_match"] >= 95.0
    out = tmp_path / "pred.json"
    task.write_predictions(examples, preds, out)
    assert json.loads(out.read_text())[examples[0]["id"]] == preds[0]


def test_official_normalisation_and_scores():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert normalize_answer("an apple and a pear") == "apple and pear"
    assert exact_match("the Louvre", "Louvre.") == 1.0
    # pred tokens {in, 1990s}, gold {late, 1990s}: overlap 1 -> p=1/2, r=1/2, F1=1/2
    assert token_f1("in the 1990s", "the late 1990s") == pytest.approx(0.5)
    assert token_f1("", "x") == 0.0
    s = squad_scores([["Paris", "City of Paris"], ["1990"]], ["city of paris", "in 1991"])
    assert s["exact_match"] == pytest.approx(50.0) and s["f1"] == pytest.approx(50.0)


def test_preset_trains_on_every_shard(tmp_path, monkeypatch):
    """`finetune squad` is the full-SQuAD recipe: the preset reads all eight training shards, each once."""
    from attnlab.tasks.splits import read_splits
    squad = tmp_path / "squad"
    squad.mkdir()
    names = ["train.json"] + [f"train_{i:02d}.json" for i in range(2, 9)]
    for k, name in enumerate(names):
        qas = [{"id": f"{name}-{j}", "question": "Where?", "answers": [{"text": "Paris", "answer_start": 26}]}
               for j in range(10)]
        _squad(tmp_path, qas).rename(squad / name)
    monkeypatch.setenv("ATTNLAB_DATA", str(tmp_path))
    path, train, valid, _, _ = read_splits(get_task("squad"), carve=True)
    assert path.split(",") == [str(squad / n) for n in names]
    ids = [ex["id"] for ex in train + valid]
    assert len(ids) == len(set(ids)) == 80 and {i.split("-")[0] for i in ids} == set(names)


def test_real_shards_hold_the_whole_training_set(data_dir):
    from attnlab.tasks.splits import read_many, resolve_files
    train, _ = resolve_files(get_task("squad"), carve=True)
    assert len(read_many(get_task("squad"), train)) == 85_646
