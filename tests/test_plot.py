"""`attnlab plot RUN_DIR`: metrics.jsonl -> PNG curves and a markdown summary."""
from __future__ import annotations

import json
import math

import pytest

from attnlab.cli import main
from attnlab.viz.plots import plot_run, read_series

PNG = b"\x89PNG\r\n\x1a\n"


def write_run(run, extra_lines=()):
    run.mkdir(parents=True, exist_ok=True)
    lines = []
    for step in range(1, 61):
        lines.append({"step": step, "loss": 5 * math.exp(-step / 20) + 1, "lr": 1e-3 * min(1, step / 10),
                      "tokens_per_s": 1000 + step, "elapsed_s": step * 0.5})
        if step % 20 == 0:  # eval on a line of its own, as a trainer logs it
            lines.append({"step": step, "eval_loss": 3 - step / 40, "eval_accuracy": 0.5 + step / 200})
    (run / "metrics.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\n" + "".join(extra_lines))
    return run


def test_pngs_and_summary(tmp_path):
    pngs, summary = plot_run(write_run(tmp_path / "sst2"))
    assert [p.name for p in pngs] == ["loss.png", "accuracy.png", "lr.png", "tokens_per_s.png"]
    for p in pngs:
        assert p.parent == tmp_path / "sst2" / "plots" and p.read_bytes()[:8] == PNG and p.stat().st_size > 5000
    text = summary.read_text()
    assert text.startswith("# sst2\n")
    assert "- steps: 1 → 60 (60 logged)" in text
    assert "| accuracy | 0.8 | 0.8 | 60 |" in text          # higher is better
    assert "| loss | 1.5 | 1.5 | 60 |" in text               # lower is better
    assert "learning rate: peak 0.001" in text and "![loss](loss.png)" in text


def test_only_what_the_run_logged(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": NaN}\n')
    pngs, summary = plot_run(run, tmp_path / "out")
    assert [p.name for p in pngs] == ["loss.png"]
    assert "non-finite at step 2" in summary.read_text()


def test_resumed_run_later_value_wins_and_partial_last_line():
    with pytest.warns(UserWarning, match="line 3: incomplete last line"):
        series = read_series(['{"step": 1, "loss": 3}', '{"step": 1, "loss": 2.5, "eval_f1": 0.7}', '{"step": 2, "lo'])
    assert series == {"loss": [(1, 2.5)], "eval_f1": [(1, 0.7)]}


def test_errors_name_file_and_line(tmp_path, capsys):
    assert main(["plot", str(tmp_path / "missing")]) == 1
    assert "metrics.jsonl: no such file" in capsys.readouterr().err
    run = tmp_path / "bad"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 1}\n{oops\n{"step": 3, "loss": 1}\n')
    assert main(["plot", str(run)]) == 1
    assert "metrics.jsonl line 2: not valid JSON" in capsys.readouterr().err
    (run / "metrics.jsonl").write_text('{"loss": 1}\n')
    assert main(["plot", str(run)]) == 1
    assert 'line 1: every record needs a numeric "step"' in capsys.readouterr().err


def test_cli(tmp_path, capsys):
    run = write_run(tmp_path / "run")
    assert main(["plot", str(run), "--output", str(tmp_path / "report")]) == 0
    out = capsys.readouterr().out
    assert "# run" in out and f"wrote {tmp_path / 'report' / 'summary.md'}" in out
    assert (tmp_path / "report" / "loss.png").read_bytes()[:8] == PNG
