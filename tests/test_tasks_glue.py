"""GLUE readers on the real tsv files, pair encoding, bad input, batching, and the metrics against
scikit-learn / scipy."""
from __future__ import annotations

import random

import pytest

from attnlab.tasks import DataError, get_task
from attnlab.tasks.common import (accuracy, collate, f1_binary, length_batches, matthews_corrcoef, pearson,
                                  spearman)
from attnlab.tasks.splits import holdout_split

COUNTS = {("sst2", "SST-2/train.tsv"): 67349, ("cola", "CoLA/train.tsv"): 8551, ("cola", "CoLA/dev.tsv"): 1043,
          ("mrpc", "MRPC/train.tsv"): 3668, ("mrpc", "MRPC/dev.tsv"): 408, ("rte", "RTE/train.tsv"): 2490,
          ("rte", "RTE/dev.tsv"): 277, ("stsb", "STS-B/train.tsv"): 5749, ("stsb", "STS-B/dev.tsv"): 1500}


@pytest.mark.parametrize("task,file", list(COUNTS))
def test_readers_count_the_official_sizes(task, file, data_dir):
    examples = get_task(task).read(data_dir / "glue" / file)
    assert len(examples) == COUNTS[(task, file)]


def test_reader_fields(data_dir):
    mrpc = get_task("mrpc").read(data_dir / "glue/MRPC/dev.tsv")
    assert mrpc[0]["label"] == "1" and mrpc[0]["texts"][0].startswith("He said the foodservice pie")
    cola = get_task("cola").read(data_dir / "glue/CoLA/dev.tsv")  # no header: the first row is data
    assert cola[0]["texts"] == ["The sailors rode the breeze clear of the rocks."] and cola[0]["label"] == "1"
    stsb = get_task("stsb").read(data_dir / "glue/STS-B/dev.tsv")
    assert stsb[0]["label"] == 5.0 and stsb[0]["texts"][1] == "A man wearing a hard hat is dancing."
    rte = get_task("rte").read(data_dir / "glue/RTE/train.tsv")
    assert get_task("rte").label_list(rte) == ["entailment", "not_entailment"]


def test_pairs_use_segment_ids(data_dir):
    import attnlab
    tok = attnlab.load_tokenizer("minilm")
    task = get_task("mrpc")
    ex = task.read(data_dir / "glue/MRPC/dev.tsv")[:4]
    feats = task.features(ex, tok, 128, {"0": 0, "1": 1}, training=True)
    f = feats[0]
    sep = f["input_ids"].index(tok.sep_token_id)
    assert set(f["token_type_ids"][:sep + 1]) == {0} and set(f["token_type_ids"][sep + 1:]) == {1}
    assert f["labels"] == 1
    assert all(len(g["input_ids"]) <= 128 for g in task.features(ex, tok, 16, {"0": 0, "1": 1}, True))


def test_missing_column_names_file_line_and_column(tmp_path):
    bad = tmp_path / "train.tsv"
    bad.write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\tonly one sentence\n")
    with pytest.raises(DataError, match=r"train.tsv:3: missing column sentence2 \(column 3\), label \(column 4\)"):
        get_task("rte").read(bad)


def test_unseen_label_is_an_error(tmp_path):
    import attnlab
    tok = attnlab.load_tokenizer("minilm")
    dev = tmp_path / "dev.tsv"
    dev.write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tcontradiction\n")
    task = get_task("rte")
    with pytest.raises(DataError, match=r"dev.tsv:2: label 'contradiction' was not seen in training"):
        task.features(task.read(dev), tok, 32, {"entailment": 0, "not_entailment": 1}, training=False)


def test_bad_score_is_reported(tmp_path):
    f = tmp_path / "train.tsv"
    f.write_text("h\n" + "\t".join(["0"] * 7 + ["a", "b", "high"]) + "\n")
    with pytest.raises(DataError, match="train.tsv:2: score .* 'high' is not a number"):
        get_task("stsb").read(f)


def test_holdout_is_deterministic_and_disjoint():
    data = list(range(1000))
    a_train, a_held = holdout_split(data, 100)
    b_train, b_held = holdout_split(data, 100)
    assert a_held == b_held and len(a_held) == 100 and not set(a_train) & set(a_held)
    assert sorted(a_train + a_held) == data


def test_length_batches_cover_everything_and_group_lengths():
    rng = random.Random(0)
    lengths = [rng.randint(3, 120) for _ in range(1000)]
    batches = length_batches(lengths, 16, shuffle=True, seed=1)
    assert sorted(i for b in batches for i in b) == list(range(1000))
    assert batches != length_batches(lengths, 16, shuffle=True, seed=2)  # a new order per epoch seed
    padded = sum(len(b) * max(lengths[i] for i in b) for b in batches)
    assert padded < 1.1 * sum(lengths)  # bucketing keeps padding small
    ordered = length_batches(lengths, 16, shuffle=False)
    assert [lengths[i] for b in ordered for i in b] == sorted(lengths)


def test_collate_pads_to_longest():
    feats = [{"input_ids": [1, 2, 3], "token_type_ids": [0, 0, 1], "labels": [5, -100, 2]},
             {"input_ids": [1, 2], "token_type_ids": [0, 0], "labels": [1, 1]}]
    b = collate(feats, pad_id=0)
    assert b["input_ids"].tolist() == [[1, 2, 3], [1, 2, 0]]
    assert b["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert b["labels"].tolist() == [[5, -100, 2], [1, 1, -100]]
    reg = collate([{"input_ids": [1], "token_type_ids": [0], "labels": 2.5}], 0)
    assert reg["labels"].dtype.is_floating_point


def test_metrics_match_sklearn_and_scipy():
    sk = pytest.importorskip("sklearn.metrics")
    stats = pytest.importorskip("scipy.stats")
    rng = random.Random(3)
    for _ in range(20):
        gold = [rng.randint(0, 1) for _ in range(200)]
        pred = [g if rng.random() < 0.7 else 1 - g for g in gold]
        assert accuracy(pred, gold) == pytest.approx(sk.accuracy_score(gold, pred))
        assert f1_binary(pred, gold) == pytest.approx(sk.f1_score(gold, pred))
        assert matthews_corrcoef(pred, gold) == pytest.approx(sk.matthews_corrcoef(gold, pred))
        x = [rng.choice([0.0, 0.5, 1.0, 2.0, 3.5, 5.0]) for _ in range(100)]  # ties, as STS-B scores have
        y = [v + rng.gauss(0, 1) for v in x]
        assert pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0])
        assert spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0])
    assert matthews_corrcoef([1] * 10, [0, 1] * 5) == 0.0  # constant predictor


def test_f1_hand_computed():
    # tp=2, fp=1, fn=1 -> 2*2 / (4 + 1 + 1)
    assert f1_binary([1, 1, 1, 0, 0], [1, 1, 0, 1, 0]) == pytest.approx(4 / 6)


def test_sst2_holds_out_whole_sentences_none_of_whose_phrases_are_trained_on(data_dir):
    """SST-2's train.tsv holds every phrase of its sentences: a random hold-out would score phrases the model
    was trained on inside longer lines. The held-out part is whole sentences and no training line is a
    phrase of one (nor is any held-out sentence inside a training line)."""
    from attnlab.tasks.splits import validation_split
    task = get_task("sst2")
    examples = task.read(data_dir / "glue/SST-2/train.tsv")
    train, held, desc = validation_split(task, examples, 872)
    assert len(held) == 872 and "whole sentences" in desc
    norm = lambda e: " ".join(e["texts"][0].split())  # noqa: E731
    held_text = {norm(e) for e in held}
    assert not held_text & {norm(e) for e in train}
    joined = "\n" + "\n".join(norm(e) for e in train) + "\n"
    assert not any(f" {t} " in joined.replace("\n", " \n ") for t in list(held_text)[:200])
    everything = "\n".join(norm(e) for e in examples)
    assert all(everything.count(t) == 1 for t in list(held_text)[:50])  # no longer line contains it
    assert 15 <= sorted(len(t.split()) for t in held_text)[436] <= 25  # sentence length, like GLUE's dev
    again = validation_split(task, examples, 872)[1]
    assert [e["line"] for e in again] == [e["line"] for e in held]


def test_whole_sentences_drops_the_lines_inside_longer_ones():
    from attnlab.tasks.splits import whole_sentences
    lines = ["a good film", "good  film", "bad", "a good", "it was bad", "a film"]
    kept = whole_sentences([{"texts": [t]} for t in lines])
    assert [e["texts"][0] for e in kept] == ["a good film", "it was bad", "a film"]  # file order
