"""benchmarks/fewlabel_vs_setfit.py's pure parts: the report sets and draws (disjoint from each other and from
attnlab's own SST-2 hold-out, deterministic by seed, drawn as the project's few-label research draws them),
the files each side reads, the scores, the table's arithmetic, and one attnlab-only smoke run (--sides)."""
from __future__ import annotations

import json
import math
import random
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from _fewlabel_data import draw, split_for, write_plain, write_task_file  # noqa: E402
from _fewlabel_table import markdown, mean_se, scores, summarize, table_rows  # noqa: E402
from fewlabel_vs_setfit import PAPER_ITERATIONS, setfit_iterations, setfit_pairs  # noqa: E402

from attnlab.tasks import get_task  # noqa: E402
from attnlab.tasks.splits import phrases  # noqa: E402


def _text(e: dict) -> str:
    return " ".join(e["texts"][0].split())


@pytest.fixture(scope="module")
def sst2(data_dir):
    return split_for("sst2", data_dir)


def test_sst2_report_set_is_a_second_clean_set_beside_the_projects(sst2):
    # the project's set (finetune's own hold-out of the whole file, split by validation_split) and the
    # report set are each 872 whole sentences and share none
    assert len({_text(e) for e in sst2["project"]}) == 872
    report = {_text(e) for e in sst2["report"]}
    assert len(report) == len(sst2["report"]) == 872
    assert not report & {_text(e) for e in sst2["project"]}
    assert "disjoint from attnlab's own 872" in sst2["note"]


def test_sst2_pool_holds_no_sentence_or_phrase_of_either_held_set(sst2):
    held_phrases = {p for e in sst2["report"] + sst2["project"] for p in phrases(_text(e))}
    pool = [_text(e) for e in sst2["pool"]]
    assert len(pool) > 4000
    assert not held_phrases & set(pool)
    # whole sentences only: no line a draw may take is a phrase of a longer pool line
    padded = [f" {t} " for t in pool]
    for t in random.Random(5).sample(pool, 200):
        assert sum(f" {t} " in other for other in padded) == 1, t


def test_draws_are_the_projects_seeded_sample_deterministic_and_disjoint(sst2):
    pool = sst2["pool"]
    a, b = draw(pool, 250, 0), draw(pool, 250, 0)
    assert a == b and draw(pool, 250, 1) != a
    assert a == random.Random(0).sample(pool, 250)  # research/fewlabel/sst2_fewlabel.py's draw
    assert len({_text(e) for e in a}) == 250
    assert not {_text(e) for e in a} & {_text(e) for e in sst2["report"] + sst2["project"]}
    # not stratified (as the project's draws are not): each draw's balance is the pool's up to chance
    share = sum(e["label"] == "1" for e in pool) / len(pool)
    for seed in (0, 1, 2):
        got = Counter(e["label"] for e in draw(pool, 1000, seed))
        assert set(got) == {"0", "1"}
        assert abs(got["1"] / 1000 - share) < 4 * math.sqrt(share * (1 - share) / 1000)
    with pytest.raises(ValueError, match="a draw of"):
        draw(pool[:10], 11, 0)


def test_cola_reports_on_dev_and_draws_from_train_only(data_dir):
    split = split_for("cola", data_dir)
    task = get_task("cola")
    assert len(split["report"]) == len(task.read(data_dir / task.valid_file))
    dev = {_text(e) for e in split["report"]}
    assert not dev & {_text(e) for e in split["pool"]}
    assert all(e["source"].endswith("train.tsv") for e in split["pool"])


@pytest.mark.parametrize("name", ["sst2", "cola"])
def test_draw_files_read_back_as_the_task_reads_them(name, data_dir, tmp_path):
    examples = draw(split_for(name, data_dir)["pool"], 20, 3) if name == "cola" else None
    if examples is None:  # SST-2's split takes seconds; a slice of its file is enough here
        task = get_task("sst2")
        examples = task.read(data_dir / task.train_file)[100:120]
    write_task_file(tmp_path / "d.tsv", name, examples)
    back = get_task(name).read(tmp_path / "d.tsv")
    assert [(_text(e), e["label"]) for e in back] == [(_text(e), e["label"]) for e in examples]
    write_plain(tmp_path / "d.jsonl", examples)
    rows = [json.loads(line) for line in (tmp_path / "d.jsonl").read_text().splitlines()]
    assert [(" ".join(r["text"].split()), r["label"]) for r in rows] == [(_text(e), int(e["label"])) for e in examples]


def test_book_reports_on_the_test_blocks_and_its_files_read_back(data_dir, tmp_path):
    """The task the defaults never saw: the report set is the books' test passages, the pool their training
    passages (no text in both); attnlab reads the titles back from its CSV, setfit gets their indices."""
    split = split_for("book", data_dir)
    assert (len(split["pool"]), len(split["report"])) == (4000, 1000)
    assert not {_text(e) for e in split["report"]} & {_text(e) for e in split["pool"]}
    assert sorted(Counter(e["label"] for e in split["report"]).values()) == [200] * 5
    examples = draw(split["pool"], 30, 0)
    write_task_file(tmp_path / "d.csv", "book", examples)
    back = get_task("text-classification").read(tmp_path / "d.csv")
    assert [(_text(e), e["label"]) for e in back] == [(_text(e), e["title"]) for e in examples]
    write_plain(tmp_path / "d.jsonl", examples)
    rows = [json.loads(line) for line in (tmp_path / "d.jsonl").read_text().splitlines()]
    assert [r["label"] for r in rows] == [e["label"] for e in examples] and {r["label"] for r in rows} <= set(range(5))


def test_scores_match_the_definitions():
    gold = [1, 1, 1, 0, 0, 0, 0, 1]
    pred = [1, 1, 0, 0, 0, 1, 0, 1]   # tp 3, tn 3, fp 1, fn 1
    s = scores(pred, gold)
    assert s["accuracy"] == pytest.approx(75.0)
    assert s["mcc"] == pytest.approx(100 * (9 - 1) / 16)
    assert scores([1, 1, 1], [1, 0, 1])["mcc"] == 0.0   # one predicted class: defined as 0
    from attnlab.tasks.common import matthews_corrcoef
    assert s["mcc"] == pytest.approx(100 * matthews_corrcoef(pred, gold))
    with pytest.raises(ValueError, match="3 predictions for 2"):
        scores([1, 0, 1], [1, 0])
    assert scores([0, 3, 4, 2], [0, 3, 1, 2]) == {"accuracy": 75.0}  # five books: accuracy only


def test_mean_and_standard_error():
    mean, se = mean_se([70.0, 72.0, 77.0])
    assert mean == pytest.approx(73.0)
    assert se == pytest.approx(math.sqrt(13.0 / 3))   # sample variance 13, over 3 draws
    assert math.isnan(mean_se([5.0])[1]) and math.isnan(mean_se([])[0])


def _row(side, draw_, acc, wall, task="sst2", mcc=None):
    score = {"accuracy": acc} if mcc is None else {"accuracy": acc, "mcc": mcc}
    return {"task": task, "size": 250, "draw": draw_, "side": side, "score": score, "train_wall_s": wall,
            "train_cpu_s": wall / 2}


def test_summary_pairs_draws_and_flags_a_difference_beyond_two_errors():
    rows = [_row("attnlab", d, 80.0 + d, 100.0) for d in range(3)]
    rows += [_row("setfit", d, 75.0 + d + 0.1 * d, 400.0) for d in range(3)]
    rows += [_row("setfit", 3, 99.0, 400.0)]   # a draw attnlab has not run: in setfit's mean, not in the difference
    (line,) = summarize(rows)
    assert line["paired_draws"] == 3 and line["draws"] == {"attnlab": [0, 1, 2], "setfit": [0, 1, 2, 3]}
    assert line["diff"][0] == pytest.approx(5.0 - 0.1)   # mean of 5.0, 4.9, 4.8
    assert line["diff"][1] == pytest.approx(0.1 / math.sqrt(3))
    assert line["real"] is True
    assert line["wall_ratio"] == pytest.approx(4.0)
    assert line["setfit"][0] == pytest.approx((75.0 + 76.1 + 77.2 + 99.0) / 4)
    noisy = [_row("attnlab", d, v, 1.0) for d, v in enumerate([80.0, 70.0, 85.0])]
    noisy += [_row("setfit", d, v, 1.0) for d, v in enumerate([75.0, 78.0, 79.0])]
    assert summarize(noisy)[0]["real"] is False   # +1.0 with an error of 5.5: not a difference


def test_cola_rows_report_mcc_and_accuracy_and_the_table_renders():
    rows = [_row(s, d, 70.0 + d, 10.0, task="cola", mcc=30.0 + d + (s == "attnlab")) for s in ("attnlab", "setfit")
            for d in range(2)]
    summary = summarize(rows)
    assert [(x["task"], x["metric"]) for x in summary] == [("cola", "mcc"), ("cola", "accuracy")]
    cells = table_rows(summary)
    assert cells[0][:4] == ["250", "cola", "mcc", "2/2"] and cells[0][6] == "1.0 +- 0.0"
    md = markdown(cells).splitlines()
    assert len(md) == 4 and md[0].count("|") == md[2].count("|")


def test_setfit_recipe_keeps_its_default_unless_it_draws_more_pairs_than_the_papers():
    # labels 0, 0, 1: same-label pairs with replacement 3 + 1, different-label 2; oversampling doubles the larger
    assert setfit_pairs([0, 0, 1], None) == 8
    assert setfit_pairs([0, 0, 1], 20) == 120
    balanced64 = [0, 1] * 32
    assert setfit_iterations(balanced64)[0] is None
    iterations, why = setfit_iterations(["0", "1"] * 125)
    assert iterations == PAPER_ITERATIONS and "num_iterations=20" in why and "default would draw" in why


def test_sizes_parse_in_order_and_a_bad_one_is_named():
    from fewlabel_vs_setfit import parse_sizes
    assert parse_sizes("sst2:64,cola:250,book:250") == [("sst2", 64), ("cola", 250), ("book", 250)]
    with pytest.raises(SystemExit, match="'mrpc:64'"):
        parse_sizes("sst2:64,mrpc:64")


def test_one_side_runs_alone_and_never_builds_the_other_sides_environment(data_dir, tmp_path):
    # --sides attnlab trains and scores attnlab alone: the setfit python named here does not exist, so a run
    # that looked for it (or built its venv) would fail; a side that is neither is refused by name
    import os
    import subprocess
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "fewlabel_vs_setfit.py"
    env = {**os.environ, "ATTNLAB_DATA": str(data_dir)}
    done = subprocess.run([sys.executable, str(script), "--work", str(tmp_path), "--sizes", "sst2:64", "--draws", "0",
                           "--limit", "16", "--sides", "attnlab", "--setfit-python", str(tmp_path / "no-such-python")],
                          capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").open()]
    assert [(r["task"], r["size"], r["draw"], r["side"]) for r in rows] == [("sst2", 64, 0, "attnlab")]
    assert 0.0 <= rows[0]["score"]["accuracy"] <= 100.0
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["sst2-64-draw0-attnlab"]
    bad = subprocess.run([sys.executable, str(script), "--work", str(tmp_path), "--sides", "attnlab,onnx"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2 and "onnx" in bad.stderr
