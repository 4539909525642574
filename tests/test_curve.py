"""`attnlab curve` end to end on tiny data: a 2-layer random BERT with MiniLM's tokenizer, a pretrained
and a from-scratch column, 2 sizes, 1 seed. The command writes a real PNG, a table holding curve.json's
numbers, a rerun trains nothing, and every point is scored on the same validation examples, none of which
is in a training subset."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import attnlab
from attnlab.cli import main
from attnlab.config import ModelConfig
from attnlab.tasks import finetune as finetune_fn
from attnlab.tasks.curve import ModelSpec, markdown_table, parse_sizes

POSITIVE = ["a warm , funny and moving film", "the best thing i have seen this year", "beautifully acted",
            "a joy from start to finish", "smart and touching", "great fun", "i loved every minute",
            "a gorgeous , witty delight", "wonderful performances", "deeply satisfying"]
NEGATIVE = ["a dull , lifeless mess", "the worst film of the year", "badly acted and boring",
            "a chore to sit through", "stupid and cruel", "no fun at all", "i hated every minute",
            "an ugly , witless bore", "terrible performances", "deeply disappointing"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    model = attnlab.from_config(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                                            dropout=0.0, attention_dropout=0.0))
    model.save(out)
    attnlab.load_tokenizer("minilm").save(out)
    return out


def _tsv(path: Path, rows: list[tuple[str, int]]) -> Path:
    path.write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in rows), encoding="utf-8")
    return path


@pytest.fixture
def files(tmp_path) -> tuple[Path, Path]:
    rows = [(t, 1) for t in POSITIVE] + [(t, 0) for t in NEGATIVE]
    return _tsv(tmp_path / "train.tsv", rows[2:10] + rows[12:]), _tsv(tmp_path / "valid.tsv", rows[:2] + rows[10:12])


def test_curve_writes_png_and_table_and_resumes(tiny, files, tmp_path, capsys, monkeypatch):
    train, valid = files
    out = tmp_path / "curve"
    argv = ["curve", "sst2", "--model", str(tiny), "--scratch", str(tiny), "--sizes", "4,all", "--seeds", "3",
            "--train", str(train), "--valid", str(valid), "--epochs", "1", "--batch-size", "4",
            "--output", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr()
    assert printed.err.count("curve: [") == 4 and "(from scratch) | 4 | seed 3: accuracy" in printed.err

    png = (out / "curve.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000  # a drawn figure, not an empty file
    runs = json.loads((out / "curve.json").read_text())["runs"]
    assert [(r["scratch"], r["size"], r["train_examples"]) for r in runs] == \
        [(False, 4, 4), (True, 4, 4), (False, None, 16), (True, None, 16)]
    assert {(r["valid"], r["valid_examples"]) for r in runs} == {(str(valid), 4)}
    table = (out / "curve.md").read_text()
    assert f"| labeled examples | {tiny} | {tiny} (from scratch) |" in table
    for size, name in ((4, "| 4 |"), (None, "| all (16) |")):
        row = next(line for line in table.splitlines() if line.startswith(name))
        assert row == name + "".join(f" {r['value']:.2f} |" for r in runs if r["size"] == size)
    assert table in printed.out

    # a rerun (one more size) trains only the new points; the finished ones are read from curve.json
    trained = []
    import attnlab.tasks as tasks
    monkeypatch.setattr(tasks, "finetune", lambda *a, **k: trained.append(k["max_train_samples"]) or finetune_fn(*a, **k))
    assert main(argv[:7] + ["4,8,all"] + argv[8:]) == 0
    assert trained == [8, 8] and "4 | seed 3: done before, skipped" in capsys.readouterr().err
    assert "| 8 |" in (out / "curve.md").read_text()
    assert not list((out / "runs").rglob("*.safetensors"))  # weights deleted once scored (no --keep-models)

    # other options would mix differently trained points into one curve: refused, naming curve.json
    assert main(argv[:-2] + ["--lr", "1e-3", "--output", str(out)]) == 1
    assert f"{out / 'curve.json'}: written with other settings (lr differ)" in capsys.readouterr().err


def test_sst2_holdout_is_the_same_for_every_point_and_never_trained_on(data_dir, tmp_path, monkeypatch):
    """On SST-2 without --valid, finetune holds out whole sentences (seed independent of the run's seed) and
    draws each subset from what remains: check that on the real file, for the sizes and seeds of a curve."""
    from attnlab.tasks import get_task
    from attnlab.tasks.splits import holdout_split, validation_split
    task = get_task("sst2")
    examples = task.read(data_dir / "glue/SST-2/train.tsv")
    train, held, _ = validation_split(task, examples, 872)
    norm = lambda ex: " ".join(ex["texts"][0].split())  # noqa: E731
    held_texts = {norm(ex) for ex in held}
    assert len(held_texts) == 872 and validation_split(task, examples, 872)[1] == held
    for seed in (1, 2):
        for size in (100, 1000):
            subset = holdout_split(train, size, seed)[1]   # what finetune(max_train_samples=size) trains on
            texts = {norm(ex) for ex in subset}
            assert len(subset) == size and not texts & held_texts
            assert not any(f" {t} " in f" {h} " for t in texts for h in held_texts)  # no held-out phrase


def test_sizes_and_table_without_runs():
    assert parse_sizes("100, 250,1k,4K,all") == [100, 250, 1000, 4000, None]
    for bad in ("0", "ten", "1.5k", ""):
        with pytest.raises(ValueError, match="--sizes"):
            parse_sizes(bad)
    table = markdown_table([], [ModelSpec("m"), ModelSpec("m", scratch=True)], [10], "accuracy")
    assert "| 10 | – | – |" in table


def test_a_validation_subset_that_would_change_with_the_seed_is_refused(tmp_path):
    from attnlab.tasks.curve import learning_curve
    with pytest.raises(ValueError, match="max_eval_samples with several seeds"):
        learning_curve("sst2", [ModelSpec("minilm")], [10], tmp_path, seeds=(1, 2), max_eval_samples=100)
    assert not (tmp_path / "curve.json").exists()


def test_pooling_and_train_embeddings_reach_every_finetune(tiny, files, tmp_path, monkeypatch):
    """--pooling and --train-embeddings pass through to each run and are part of the curve's settings, so a
    rerun with another pooling cannot mix its points into this curve."""
    train, valid = files
    seen = []
    import attnlab.tasks as tasks
    monkeypatch.setattr(tasks, "finetune", lambda *a, **k: seen.append(k) or finetune_fn(*a, **k))
    out = tmp_path / "curve"
    argv = ["curve", "sst2", "--scratch", str(tiny), "--sizes", "4", "--train", str(train), "--valid", str(valid),
            "--epochs", "1", "--batch-size", "4", "--pooling", "mean", "--train-embeddings", "--output", str(out)]
    assert main(argv) == 0
    assert [(k["pooling"], k["freeze_embeddings"]) for k in seen] == [("mean", False)]
    settings = json.loads((out / "curve.json").read_text())["settings"]
    assert settings["pooling"] == "mean" and settings["freeze_embeddings"] is False
    assert main(argv[:-4] + ["cls", "--train-embeddings", "--output", str(out)]) == 1   # other pooling: refused
