"""benchmarks/glue_vs_transformers.py's pure parts: the statistics and the table, SST-2's report set (disjoint
from finetune's own held-out sentences and from the training file both sides get) and the unseen task's split
(test passages come from whole blocks of each book, never next to a training passage). No training here."""
from __future__ import annotations

import csv
import math
from collections import Counter
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import _glue_data as gd  # noqa: E402
import glue_vs_transformers as bench  # noqa: E402


def test_mean_and_standard_error():
    mean, se = bench.mean_se([1.0, 2.0, 3.0, 6.0])
    assert mean == 3.0
    assert se == pytest.approx(math.sqrt((4 + 1 + 0 + 9) / 3 / 4))  # sample variance (n-1), over n
    assert bench.mean_se([5.0]) == (5.0, None)


def test_compare_counts_a_difference_only_beyond_two_standard_errors():
    clear = bench.compare([80.0, 81.0, 82.0], [70.0, 71.0, 72.0])
    assert clear["diff"] == pytest.approx(10.0) and clear["verdict"] == "attnlab better"
    assert clear["se"] == pytest.approx(math.sqrt(2 * (1 / 3)))
    worse = bench.compare([70.0, 71.0, 72.0], [80.0, 81.0, 82.0])
    assert worse["verdict"] == "attnlab worse"
    noisy = bench.compare([70.0, 80.0, 90.0], [72.0, 78.0, 84.0])  # diff 4, 2 SE ~ 13.5
    assert noisy["verdict"] == "within 2 SE"
    assert bench.compare([1.0], [2.0])["verdict"].startswith("n/a")


def _rec(task, side, seed, metrics, wall, cpu):
    return {"task": task, "side": side, "seed": seed, "metrics": metrics, "wall_s": wall, "cpu_s": cpu,
            "config": {"threads": 1, "limit": None, "padding": "dynamic"}}


def test_table_rows_means_ratios_and_markdown():
    records = [_rec("mrpc", "attnlab", s, {"f1": 88.0 + s, "accuracy": 84.0}, 98.0 + s, 90.0) for s in (1, 2, 3)]
    records += [_rec("mrpc", "trainer", s, {"f1": 86.0 + s, "accuracy": 83.0 + s}, 400.0, 380.0) for s in (1, 2, 3)]
    records += [_rec("rte", "attnlab", 1, {"accuracy": 60.0}, 10.0, 10.0)]  # no Trainer run yet: no row
    rows = bench.summarize(records, ["rte", "mrpc"], {"rte": ("accuracy",), "mrpc": ("f1", "accuracy")})
    assert [r[:2] for r in rows] == [["mrpc", "f1"], ["", "accuracy"]]
    f1 = rows[0]
    assert f1[2] == "90.00 ± 0.58" and f1[3] == "88.00 ± 0.58" and f1[4] == "+2.00"
    assert f1[6] == "attnlab better" and f1[7] == "3/3"  # 2 SE of the difference = 1.63 < 2
    assert f1[8:11] == ["100 ± 1", "400 ± 0", "0.25x"] and f1[13] == "0.24x"
    assert rows[1][6] == "within 2 SE" and rows[1][8:] == [""] * 6
    md = bench.markdown(rows).splitlines()
    assert md[0].startswith("| task | metric | attnlab | Trainer |") and len(md) == 4
    assert md[2].count("|") == len(bench.HEADER) + 1


def test_results_of_another_configuration_or_a_rerun_count_once():
    config = {"threads": 1, "limit": None, "padding": "dynamic"}
    a = _rec("rte", "trainer", 1, {"accuracy": 60.0}, 1.0, 1.0)
    b = {**a, "metrics": {"accuracy": 61.0}}  # the same run done again: the latest counts
    other = {**a, "config": {**config, "padding": "max"}}
    got = bench.current([a, b, other, _rec("rte", "trainer", 9, {"accuracy": 1.0}, 1.0, 1.0)], [1], config)
    assert [r["metrics"]["accuracy"] for r in got.values()] == [61.0]
    assert bench.parse_limit("64,32") == [64, 32] and bench.parse_limit("64") == [64, 64]


@pytest.fixture(scope="module")
def sst2(data_dir):
    from attnlab.tasks import get_task
    examples = get_task("sst2").read(data_dir / "glue/SST-2/train.tsv")
    return examples, gd.sst2_split(examples)


def test_sst2_report_set_is_whole_unseen_sentences(sst2):
    from attnlab.tasks.splits import phrases
    examples, (train, report, project_held) = sst2
    assert len(report) == 872 and len(project_held) == 872
    report_texts = {gd.normalized(ex) for ex in report}
    # disjoint from the 872 finetune holds out of the full file (what its defaults were measured on)
    assert not report_texts & {gd.normalized(ex) for ex in project_held}
    # neither a report sentence nor any phrase of one is in the training file
    train_texts = {gd.normalized(ex) for ex in train}
    assert not {p for t in report_texts for p in phrases(t)} & train_texts
    # whole sentences: no line of the full file contains a report sentence as a proper phrase
    # (finetune's own hold-out of that file is a part of it, so it is disjoint from the report set too)
    lines = Counter(gd.normalized(ex) for ex in examples)
    corpus = "\n".join(f" {t} " for t in lines.elements())
    for t in report_texts:
        assert corpus.count(f" {t} ") == lines[t], t
    # and the training file keeps everything else: the project's own held-out sentences stay in it
    assert len(train) > len(examples) - 872 * 30
    assert {gd.normalized(ex) for ex in project_held} <= train_texts


def test_sst2_files_keep_the_glue_format(sst2, data_dir, tmp_path):
    from attnlab.tasks import get_task
    _, (train, report, _) = sst2
    path = gd.write_examples(tmp_path / "report.tsv", data_dir / "glue/SST-2/train.tsv", report[:5], True)
    back = get_task("sst2").read(path)
    assert [(b["texts"], b["label"]) for b in back] == [(r["texts"], r["label"]) for r in report[:5]]


def test_block_split_is_contiguous_and_keeps_a_gap():
    train, test = gd.block_split(1000, seed=3, blocks=10, test_blocks=2, gap=3)
    test_set = set(test)
    assert len(test) == 200 and not test_set & set(train)
    # test positions are two runs of 100 consecutive positions, each a whole block
    runs = [test[0]] + [b for a, b in zip(test, test[1:]) if b != a + 1]
    assert all(start % 100 == 0 for start in runs)
    assert min(abs(i - j) for i in train for j in test) > 3
    assert len(train) >= 800 - 2 * 2 * 3


def test_book_task_rows(data_dir, tmp_path):
    train, test = gd.book_rows(data_dir)
    assert len(train) == 5 * gd.BOOK_TRAIN and len(test) == 5 * gd.BOOK_TEST
    for title in gd.BOOKS.values():
        tr = [pos for _, label, pos in train if label == title]
        te = [pos for _, label, pos in test if label == title]
        assert len(tr) == gd.BOOK_TRAIN and len(te) == gd.BOOK_TEST
        assert min(abs(i - j) for i in tr for j in te) > gd.BOOK_GAP  # never neighbours
    assert not {t for t, _, _ in train} & {t for t, _, _ in test}
    assert all(len(t.split()) >= 8 and "Gutenberg" not in t for t, _, _ in train + test)
    path = gd.write_csv(tmp_path / "test.csv", test[:3])
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == ["text", "label"] and rows[1] == [test[0][0], test[0][1]]


def test_passages_follow_sentences():
    text = ("header\n*** START OF THIS BOOK ***\nChapter I.\n\nMr. Smith came home late. He was tired and "
            "wet, and the fire had gone out long before he arrived. \"Who is there?\" asked his wife from the "
            "stairs, holding up a candle.\n\nEnd of the Project Gutenberg EBook of Tests\n*** END OF THIS BOOK")
    passages = gd.book_passages(text)
    joined = " ".join(passages)
    assert "Mr. Smith came home late." in joined  # no break after a title
    assert "Chapter" not in joined and "Gutenberg" not in joined and "header" not in joined
    assert all(len(p.split()) >= 8 for p in passages)


def test_a_line_cut_by_a_kill_loses_only_its_own_run(tmp_path):
    results = tmp_path / "results.jsonl"
    bench.append_line(results, '{"run": 1}')
    with open(results, "a") as fh:
        fh.write('{"run": 2, "metr')  # killed while writing
    bench.append_line(results, '{"run": 3}')
    assert [r["run"] for r in bench.read_results(results)] == [1, 3]


def test_conll_subsets_are_written_back_as_conll(tmp_path, data_dir):
    from attnlab.tasks import get_task
    task = get_task("conll2003")
    full = task.read(data_dir / "conll2003" / "valid.txt")
    chosen = gd.subset(full, 20)
    back = task.read(gd.write_conll(tmp_path / "part.txt", chosen))
    assert [(ex["words"], ex["tags"]) for ex in back] == [(ex["words"], ex["tags"]) for ex in chosen]


def test_trainer_side_ner_labels_first_pieces_and_reads_tags_back(minilm):
    """run_ner's alignment: a word's first piece carries its tag and the other pieces -100; reading logits
    that put all weight on those labels gives every word its tag back, a word past the length limit "O"."""
    import numpy as np
    import transformers
    import _glue_trainer as gt
    tok = transformers.AutoTokenizer.from_pretrained(minilm)
    examples = [{"words": ["Xylofrabblers", "beat", "Somerset", "."], "tags": ["B-ORG", "O", "B-ORG", "O"]},
                {"words": ["Peter", "Blackburn"], "tags": ["B-PER", "I-PER"]}]
    labels = ["B-ORG", "B-PER", "I-PER", "O"]
    enc = gt.pieces(tok, examples)
    rows = gt.encode_words(enc, examples, {name: i for i, name in enumerate(labels)})
    first = [r["labels"] for r in rows]
    assert sum(x != -100 for x in first[0]) == 4 and len(first[0]) > 6  # "Xylofrabblers" is several pieces
    width = max(len(r) for r in first)
    logits = np.full((2, width, len(labels)), -1.0)
    for i, row in enumerate(first):
        for j, label in enumerate(row):
            if label != -100:
                logits[i, j, label] = 1.0
    assert gt.word_tags(enc, examples, logits, labels) == [ex["tags"] for ex in examples]
    long = [{"words": ["x"] * 600, "tags": ["B-PER"] * 600}]
    assert gt.word_tags(gt.pieces(tok, long), long, np.zeros((1, 512, 4)), labels)[0][-1] == "O"


def test_a_run_held_by_one_instance_is_not_taken_by_another(tmp_path):
    lock = tmp_path / "attnlab-seed1.lock"
    with bench.claimed(lock) as first:
        with bench.claimed(lock) as second:
            assert first and not second
    with bench.claimed(lock) as again:
        assert again


def test_a_killed_instance_leaves_its_run_free(tmp_path):
    import subprocess
    lock = tmp_path / "attnlab-seed1.lock"
    code = ("import sys, time; sys.path.insert(0, sys.argv[1]); import glue_vs_transformers as b; "
            "cm = b.claimed(__import__('pathlib').Path(sys.argv[2])); assert cm.__enter__(); "
            "print('held', flush=True); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code, str(Path(bench.__file__).parent), str(lock)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        with bench.claimed(lock) as mine:
            assert not mine
    finally:
        child.kill()
        child.wait()
    with bench.claimed(lock) as mine:
        assert mine


def test_resume_sees_runs_another_instance_finished(tmp_path):
    results = tmp_path / "results.jsonl"
    config = {"threads": 1, "limit": None, "padding": "dynamic"}
    assert bench.finished(results) == set()
    bench.append_line(results, '{"task": "rte", "side": "attnlab", "seed": 1, "config": '
                      '{"threads": 1, "limit": null, "padding": "dynamic"}}')
    assert bench.run_key("rte", "attnlab", 1, config) in bench.finished(results)


def test_data_files_are_replaced_whole_under_a_reader(tmp_path):
    # another instance reading the file while this one writes it again sees one whole version
    path = gd.write_lines(tmp_path / "train.tsv", "sentence\tlabel", ["old\t0"] * 1000)
    with open(path) as reader:
        gd.write_lines(path, "sentence\tlabel", ["new\t1"])
        assert reader.read().count("old\t0") == 1000
    rows = [("a passage", "Emma", 0)]
    with open(gd.write_csv(tmp_path / "train.csv", rows * 500)) as reader:
        gd.write_csv(tmp_path / "train.csv", rows)
        assert reader.read().count("a passage") == 500
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.csv", "train.tsv"]
    assert path.read_text() == "sentence\tlabel\nnew\t1\n"


def test_resume_and_rerun_run_only_what_is_missing_or_asked_again(tmp_path, monkeypatch, capsys):
    # the main loop with the two sides faked: --resume runs nothing that is in the results file; --rerun
    # attnlab runs attnlab's side again (its defaults changed) and keeps the Trainer's, the newer run counting
    import attnlab.interop.local as local
    prepared = gd.Prepared("rte", "rte", tmp_path / "train.tsv", tmp_path / "dev.tsv", ("accuracy",), "rte files")
    calls = []

    def fake(side, score):
        def run(p, seed, out, *rest):
            calls.append((side, seed))
            return {"metrics": {"accuracy": score}, "wall_s": 1.0, "cpu_s": 1.0}
        return run
    monkeypatch.setattr(bench, "prepare", lambda *a: prepared)
    monkeypatch.setattr(bench, "data_root", lambda: tmp_path)
    monkeypatch.setattr(local, "resolve", lambda name: tmp_path / name)
    monkeypatch.setattr(bench, "run_trainer", fake("trainer", 60.0))

    def main(*flags, attnlab_score=70.0):
        monkeypatch.setattr(bench, "run_attnlab", fake("attnlab", attnlab_score))
        monkeypatch.setattr(sys, "argv", ["glue_vs_transformers.py", "--work", str(tmp_path), "--tasks", "rte",
                                          "--seeds", "1", "--threads", "1", *flags])
        calls.clear()
        bench.main()
        return list(calls)

    assert main() == [("attnlab", 1), ("trainer", 1)]
    assert main("--resume") == []
    assert main("--rerun", "attnlab", attnlab_score=75.0) == [("attnlab", 1)]
    assert main("--resume", attnlab_score=0.0) == []
    table = capsys.readouterr().out.rsplit("report sets", 1)[1]
    assert "75.00" in table and "60.00" in table and "70.00" not in table
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 3
    # --sides attnlab: that side alone (a seed the results lack), the Trainer's side not started
    assert main("--resume", "--sides", "attnlab", "--seeds", "2") == [("attnlab", 2)]
    with pytest.raises(SystemExit, match="--sides"):
        main("--sides", "onnx")
