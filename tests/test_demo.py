"""examples/demo.py (`make demo`) is the short tour of the five jobs: each step prints the commands a user would type
before running them, and every printed `attnlab` command is one the CLI's own parser accepts, reading only files
that ship in examples/data and writing only under out/demo. The commands are recorded here, not run (the real
`make demo` runs them); the demo's own output is printed as it would be."""
from __future__ import annotations

import argparse
import importlib.util
import shlex
import sys
from pathlib import Path

import pytest

from attnlab.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent

# the commands each step must show, in order of first appearance: the five jobs users come for
JOBS = [["embed", "index", "search"], ["finetune", "predict"], ["generate", "serve"], ["viz"], ["info"]]


@pytest.fixture(scope="module")
def demo():
    spec = importlib.util.spec_from_file_location("attnlab_demo", ROOT / "examples" / "demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def printed_commands(demo, monkeypatch, capsys, tmp_path) -> list[list[str]]:
    """Every step's printed `$ attnlab ...` lines, split as a shell would, one list per step. Nothing runs: the
    command runner, the background server and the reads of files the commands would have written are stubbed."""
    ran = []
    FakeServer.started = []
    monkeypatch.setattr(demo, "execute", ran.append)
    monkeypatch.setattr(demo, "show", lambda path, limit=5: print(f"$ head -n {limit} {path}"))
    monkeypatch.setattr(demo, "wait_until_up", lambda server, url, log: None)
    monkeypatch.setattr(demo.subprocess, "Popen", FakeServer)
    monkeypatch.setattr(demo.urllib.request, "urlopen", fake_urlopen)
    monkeypatch.setattr(demo, "side_by_side", lambda labels, texts: None)
    monkeypatch.setattr(demo, "explore_picture", lambda path: None)  # the real-run test below takes it
    monkeypatch.chdir(tmp_path)  # the one file the tour itself writes (the server's log) lands here
    (tmp_path / demo.OUT).mkdir(parents=True)
    steps = []
    for _, step in demo.STEPS:
        step()
        lines = capsys.readouterr().out.splitlines()
        steps.append([shlex.split(line[2:]) for line in lines if line.startswith("$ attnlab ")])
    # the runner saw exactly the commands printed for it (serve runs as a subprocess, not through it)
    assert ran == [c[1:] for s in steps for c in s if c[1] != "serve"]
    assert FakeServer.started == [[sys.executable, "-m", *c] for s in steps for c in s if c[1] == "serve"]
    return steps


class FakeServer:
    started: list[list[str]] = []

    def __init__(self, argv, **kwargs):
        FakeServer.started.append(argv)

    def terminate(self):
        pass

    def wait(self, timeout=None):
        return 0


class FakeResponse:
    def __init__(self, body: bytes):
        self.body = body

    def read(self):
        return self.body

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def fake_urlopen(request, timeout=None):
    import json
    texts = json.loads(request.data)["input"]
    return FakeResponse(json.dumps({"data": [{"index": i, "label": "positive", "score": 0.9}
                                             for i in range(len(texts))]}).encode())


def test_the_steps_are_the_five_jobs_in_order(demo, monkeypatch, capsys, tmp_path):
    steps = printed_commands(demo, monkeypatch, capsys, tmp_path)
    assert len(demo.STEPS) == len(JOBS) == 5
    shown = [list(dict.fromkeys(c[1] for c in step)) for step in steps]
    assert shown == JOBS
    assert any(c[1] == "generate" and "--chat" in c for c in steps[2])
    assert any(c[1] == "info" and "--explain" in c for c in steps[4])


def test_every_printed_command_parses_and_stays_in_its_lane(demo, monkeypatch, capsys, tmp_path):
    parser = build_parser()
    commands = [c for step in printed_commands(demo, monkeypatch, capsys, tmp_path) for c in step]
    assert len(commands) >= 9
    for command in commands:
        assert command[0] == "attnlab"
        args = parser.parse_args(command[1:])  # argparse exits (SystemExit) on anything it does not accept
        assert isinstance(args, argparse.Namespace) and args.run is not None
        for flag in ("--input", "--train", "--valid"):  # read: bundled files only, so a clean clone runs it
            if flag in command:
                path = command[command.index(flag) + 1]
                assert path.startswith(demo.DATA + "/") and (ROOT / path).is_file(), (command, path)
        if "--output" in command:  # written: out/demo only (git-ignored), never the checkout itself
            assert command[command.index("--output") + 1].startswith(demo.OUT + "/"), command
    finetune = next(c for c in commands if c[1] == "finetune")
    assert finetune[2] == "text-classification" and "--model" in finetune and "minilm" in finetune
    # the server serves the model the fine-tune wrote, on the port the demo chose
    serve = next(c for c in commands if c[1] == "serve")
    assert serve[2] == finetune[finetune.index("--output") + 1] and int(serve[serve.index("--port") + 1]) > 0


def test_the_own_file_has_text_and_named_labels(demo):
    import csv
    for name in ("reviews-train.csv", "reviews-valid.csv"):
        with open(ROOT / demo.DATA / name, encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        assert rows and all(r["text"].strip() for r in rows), name
        assert {r["label"] for r in rows} == {"positive", "negative"}, name  # names, not 0/1
    new = (ROOT / demo.DATA / "reviews-new.txt").read_text(encoding="utf-8").splitlines()
    assert new and all(line.strip() for line in new)


def test_the_closing_links_point_at_pages_that_exist(demo):
    assert demo.DOCS[0] == "docs/getting-started.md"
    for page in demo.DOCS:
        assert (ROOT / page).is_file(), page


def test_the_two_quick_steps_run_for_real(demo, monkeypatch, capsys, tmp_path):
    """Steps 4 and 5 take seconds: run them on the packaged MiniLM, as `make demo` does."""
    monkeypatch.chdir(tmp_path)
    demo.see_attention()
    demo.walk_through_a_layer()
    page = tmp_path / demo.OUT / "attention.html"
    assert page.is_file() and page.stat().st_size > 10_000
    assert "<html" in page.read_text(encoding="utf-8")[:2000].lower()
    out = capsys.readouterr().out
    assert "$ attnlab viz minilm" in out and "$ attnlab info minilm --explain" in out
    assert "parameters: 22,713,216" in out  # all-MiniLM-L6-v2's count, from the real files
    # the explorer's command is shown (and parses); its picture is written, or the reason it was not
    line = next(ln for ln in out.splitlines() if "attnlab explore minilm" in ln)
    assert build_parser().parse_args(["explore", "minilm"]).run is not None, line
    from attnlab.explore.screenshot import unavailable
    picture = tmp_path / demo.OUT / "explore.png"
    if unavailable() is None:
        assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and picture.stat().st_size > 10_000
    else:
        assert not picture.exists() and "no picture of the explorer" in out
