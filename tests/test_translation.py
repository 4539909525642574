"""Translation task: parallel-file checks, joint BPE, batching, the schedule, BLEU, and a CLI smoke run
(finetune translation -> translate -> evaluate translation) on a few hundred real Multi30k pairs."""
from __future__ import annotations

import json
import warnings

import pytest

from attnlab.cli import main
from attnlab.tasks.common import DataError
from attnlab.tasks.translation import (bleu, encode, inverse_sqrt_lr, read_parallel, token_batches,
                                       train_joint_bpe)


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_mismatched_line_counts_name_both_files(tmp_path):
    src = _write(tmp_path / "a.en", ["one", "two", "three"])
    tgt = _write(tmp_path / "a.de", ["eins", "zwei"])
    with pytest.raises(DataError) as err:
        read_parallel(src, tgt)
    msg = str(err.value)
    assert str(src) in msg and str(tgt) in msg and "3 lines" in msg and "has 2" in msg


def test_empty_lines_are_reported_and_skipped(tmp_path):
    src = _write(tmp_path / "b.en", ["one", "", "three", "four"])
    tgt = _write(tmp_path / "b.de", ["eins", "zwei", "drei", "  "])
    with pytest.warns(UserWarning, match=r"skipped 2 pair\(s\) with an empty line \(line 2, 4\)"):
        pairs = read_parallel(src, tgt)
    assert pairs == [("one", "eins"), ("three", "drei")]


def test_joint_bpe_round_trip_and_truncation(tmp_path):
    src = _write(tmp_path / "c.en", ["A man rides a bike.", "Two dogs play in the snow."] * 20)
    tgt = _write(tmp_path / "c.de", ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee."] * 20)
    tok = train_joint_bpe([src, tgt], vocab_size=120, min_frequency=1)
    assert [tok.backend.token_to_id(t) for t in ("<pad>", "</s>", "<s>", "<unk>")] == [0, 1, 2, 3]
    for text in ("Zwei Hunde spielen im Schnee.", "A man rides a bike."):
        ids = tok.encode(text)
        assert ids[-1] == 1 and tok.decode(ids) == text  # detokenized exactly: what sacreBLEU scores
    with pytest.warns(UserWarning, match="1 of 2 sentences exceed max_length=5 tokens and were truncated"):
        rows = encode(tok, ["A man.", "Two dogs play in the snow and a man rides a bike."], 5)
    assert len(rows[1]) == 5 and rows[1][-1] == 1


def test_batches_schedule_and_bleu():
    lengths = [3, 50, 7, 7, 20, 4, 33, 12] * 10
    batches = token_batches(lengths, max_tokens=120, shuffle=True)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert all(max(lengths[i] for i in b) * len(b) <= 120 or len(b) == 1 for b in batches)
    peak = inverse_sqrt_lr(4000, 512, 4000)
    assert inverse_sqrt_lr(2000, 512, 4000) == pytest.approx(peak / 2)
    assert inverse_sqrt_lr(16000, 512, 4000) == pytest.approx(peak / 2)
    # the Trainer's inverse_sqrt schedule (0-based steps) times the peak is the paper's formula (1-based)
    from attnlab.training import lr_factor
    for step in (0, 1, 999, 3999, 4000, 16000):
        got = peak * lr_factor(step, warmup_steps=4000, max_steps=1, schedule="inverse_sqrt")
        assert got == pytest.approx(inverse_sqrt_lr(step + 1, 512, 4000), rel=1e-12)
    assert peak == pytest.approx(512 ** -0.5 * 4000 ** -0.5)
    assert bleu(["Ein Hund läuft im Schnee ."], ["Ein Hund läuft im Schnee ."])["bleu"] == 100.0


def test_cli_smoke_train_translate_evaluate(tmp_path, data_dir, capsys):
    d = data_dir / "multi30k"
    if not (d / "train.en").exists():
        pytest.skip("multi30k not available")
    en = (d / "train.en").read_text(encoding="utf-8").splitlines()[:300]
    de = (d / "train.de").read_text(encoding="utf-8").splitlines()[:300]
    files = {k: _write(tmp_path / k, v) for k, v in
             {"tr.en": en[:260], "tr.de": de[:260], "va.en": en[260:], "va.de": de[260:]}.items()}
    out = tmp_path / "model"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rc = main(["finetune", "translation", "--src-lang", "en", "--tgt-lang", "de",
                   "--train-src", str(files["tr.en"]), "--train-tgt", str(files["tr.de"]),
                   "--valid-src", str(files["va.en"]), "--valid-tgt", str(files["va.de"]), "--output", str(out),
                   "--set", "hidden_size=32", "--set", "num_layers=1", "--set", "num_heads=2",
                   "--set", "intermediate_size=64", "--vocab-size", "300", "--max-tokens", "800",
                   "--epochs", "1", "--warmup", "5"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] > 0 and summary["best"]["bleu"] >= 0 and (out / "model.safetensors").exists()
    assert json.loads((out / "config.json").read_text())["extra"]["src_lang"] == "en"
    inp = _write(tmp_path / "in.en", ["A dog runs.", "", "Two men sit on a bench."])
    hyp = tmp_path / "hyp.de"
    assert main(["translate", str(out), "--input", str(inp), "--output", str(hyp), "--num-beams", "2"]) == 0
    lines = hyp.read_text(encoding="utf-8").split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""  # 3 lines, the empty one kept
    assert "1 empty input line" in capsys.readouterr().err
    assert main(["evaluate", "translation", "--model", str(out), "--source", str(files["va.en"]),
                 "--reference", str(files["va.de"]), "--num-beams", "1"]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert scores["sentences"] == 40 and "BLEU" not in scores and scores["signature"].startswith("nrefs:1")
    bad = _write(tmp_path / "short.de", de[:3])
    assert main(["evaluate", "translation", "--model", str(out), "--source", str(files["va.en"]),
                 "--reference", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "va.en has 40 lines" in err and "short.de has 3" in err


def test_translation_stops_on_a_non_finite_loss_keeping_the_best_checkpoint(tmp_path, capsys, monkeypatch):
    """Translation runs on the shared Trainer: a NaN loss after the first validation stops the run before
    the optimizer step, naming the step and the kept best checkpoint, which stays loadable."""
    from attnlab.models.seq2seq import Seq2SeqLM
    src = ["a dog runs", "two men sit", "a cat sleeps", "the sun is hot"] * 8
    tgt = ["ein hund läuft", "zwei männer sitzen", "eine katze schläft", "die sonne ist heiß"] * 8
    files = {k: _write(tmp_path / k, v) for k, v in {"s": src, "t": tgt}.items()}
    calls = {"n": 0}
    real = Seq2SeqLM.forward

    def poisoned(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        if self.training and out.loss is not None:
            calls["n"] += 1
            if calls["n"] == 5:
                out.loss = out.loss * float("nan")
        return out
    monkeypatch.setattr(Seq2SeqLM, "forward", poisoned)
    out = tmp_path / "m"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rc = main(["finetune", "translation", "--train-src", str(files["s"]), "--train-tgt", str(files["t"]),
                   "--valid-src", str(files["s"]), "--valid-tgt", str(files["t"]), "--output", str(out),
                   "--set", "hidden_size=16", "--set", "num_layers=1", "--set", "num_heads=2",
                   "--set", "intermediate_size=32", "--vocab-size", "120", "--max-tokens", "64",
                   "--epochs", "3", "--warmup", "2", "--eval-every", "2", "--no-progress"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "loss became nan at step 5" in err and "the best model so far (step" in err
    assert (out / "model.safetensors").exists() and main(["evaluate", "translation", "--model", str(out),
                                                          "--source", str(files["s"]), "--reference",
                                                          str(files["t"]), "--num-beams", "1"]) == 0
