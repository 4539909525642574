"""Every attnlab command that reads a file or directory, given a missing path, a directory where a file
belongs (or a file where a directory belongs) or an unreadable path, prints exactly one line on stderr
naming the option and the path, exits non-zero, and shows a traceback only with --debug."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnlab.cli import main
from attnlab.cli.paths import INPUTS
from attnlab.config import ModelConfig
from attnlab.interop.hf import save_pretrained
from attnlab.models.encoder import Encoder

REPO = Path(__file__).resolve().parents[2]
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> dict[str, Path]:
    """Valid inputs of every kind, so that only the argument under test is wrong."""
    root = tmp_path_factory.mktemp("good")
    torch.manual_seed(0)
    model = save_pretrained(Encoder(ModelConfig(vocab_size=30, hidden_size=8, num_layers=1, num_heads=2,
                                                intermediate_size=16, max_position_embeddings=16)), root / "model")
    text = root / "text.txt"
    text.write_text("hello world\n")
    (root / "dir").mkdir()
    return {"model": model, "file": text, "dir": root / "dir", "out": root / "out"}


def argv_for(command: str, dest: str, bad: str, good: dict[str, Path]) -> list[str]:
    """A command line that is valid except for `dest`, which gets `bad`."""
    m, f, d, o = (str(good[k]) for k in ("model", "file", "dir", "out"))
    base = {
        "info": lambda v: ["info", v["model"]],
        "embed": lambda v: ["embed", v["model"], "--input", v["input"], "--output", o],
        "index": lambda v: ["index", v["passages"], "--model", v["model"], "--output", o],
        "search": lambda v: ["search", v["index"], "--model", v["model"], "--squad", v["squad"]],
        "generate": lambda v: ["generate", v["model"], "--prompt", "hi", "--adapter", v["adapter"]],
        "viz": lambda v: ["viz", v["model"], "--text", "hi", "--output", o],
        "plot": lambda v: ["plot", v["run_dir"]],
        "finetune": lambda v: ["finetune", "translation", "--output", o, "--model", v["model"], "--train", v["train"],
                               "--valid", v["valid"], "--test", v["test"], *[x for n in ("train_src", "train_tgt", "valid_src", "valid_tgt")
                                                        for x in ("--" + n.replace("_", "-"), v[n])]],
        "soup": lambda v: ["soup", v["models"], m, "--output", o],
        "evaluate": lambda v: ["evaluate", "sst2", "--model", v["model"], "--data", v["data"], "--source",
                               v["source"], "--reference", v["reference"]],
        "predict": lambda v: ["predict", "sst2", "--model", v["model"], "--input", v["input"], "--output", o],
        "tokenizer": lambda v: ["tokenizer", "train", "--kind", "char", "--output", o, f, v["files"]],
        "prepare": lambda v: ["prepare", "--tokenizer", v["tokenizer"], "--output", o, f, v["files"]],
        "pretrain": lambda v: ["pretrain", "--config", v["config"]],
        "distill": lambda v: ["distill", "--teacher", v["teacher"], "--corpus", v["corpus"], "--student-layers", "1",
                              "--output", o],
        "translate": lambda v: ["translate", v["model"], "--input", v["input"], "--output", o],
        "serve": lambda v: ["serve", v["model"], "--api-key-file", v["api_key_file"], "--ssl-certfile", v["ssl_certfile"],
                            "--ssl-keyfile", v["ssl_keyfile"], "--adapter", v["adapter"]],
        "explore": lambda v: ["explore", v["model"], "--api-key-file", v["api_key_file"]],
        "curve": lambda v: ["curve", "sst2", "--model", v["model"], "--scratch", v["scratch"], "--train", v["train"],
                            "--valid", v["valid"], "--output", o],
        "sft": lambda v: ["sft", v["model"], "--data", v["data"], "--valid", v["valid"], "--output", o],
        "dpo": lambda v: ["dpo", v["model"], "--data", v["data"], "--output", o],
        "experiment": lambda v: ["experiment", "sqrt-dk", "--tiny", "--data", v["data"], "--output", o],
        "evaluate-prompting": lambda v: ["evaluate-prompting", "--model", v["model"], "--data", v["data"], "--pool", v["pool"]],
    }[command]
    values = {k: {"file": f, "files": f, "dir": d, "model": m, "models": m, "model_or_preset": m, "tokenizer": d, "run_dir": d, "adapters": d}[kind]
              for k, kind in INPUTS[command].items()}
    values[dest] = bad
    return base(values)


CASES = [(c, d, k) for c, dests in INPUTS.items() for d, k in dests.items()]
OPTION = {"model": "MODEL", "run_dir": "RUN_DIR", "files": "FILES"}


def option_of(command: str, dest: str) -> str:
    if command == "info" and dest == "model":
        return "MODEL_OR_PRESET"
    if command == "index" and dest == "passages":
        return "PASSAGES"
    if command == "search" and dest == "index":
        return "INDEX"
    if command == "soup":
        return "MODEL"
    if command in ("info", "embed", "generate", "viz", "plot", "tokenizer", "prepare", "translate", "serve",
                   "sft", "dpo", "explore") \
            and dest in OPTION:
        return OPTION[dest]
    return "--" + dest.replace("_", "-")


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line(code: int, err: str, option: str, path: str, reason: str, command: str) -> None:
    assert code != 0
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"attnlab {command}: error: {option} {path}: "), lines[0]
    assert reason in lines[0], lines[0]
    assert "Traceback" not in err


def test_every_command_with_a_path_is_covered():
    import importlib
    from attnlab.cli import COMMANDS
    assert set(INPUTS) == {importlib.import_module(f"attnlab.cli.{c}").NAME for c in COMMANDS}


@pytest.mark.parametrize("command,dest,kind", CASES, ids=[f"{c}-{d}" for c, d, _ in CASES])
def test_missing_path(command, dest, kind, good, capsys, tmp_path):
    missing = str(tmp_path / "no" / "such.txt")
    code, _, err = run_cli(argv_for(command, dest, missing, good), capsys)
    named = missing + "/metrics.jsonl" if kind == "run_dir" else missing  # plot names the file it needs
    assert_one_line(code, err, option_of(command, dest), named, "no such", command)


WRONG_TYPE = [(c, d, k) for c, d, k in CASES
              if k in ("file", "files", "dir", "run_dir", "model", "models", "model_or_preset", "adapters")]


@pytest.mark.parametrize("command,dest,kind", WRONG_TYPE, ids=[f"{c}-{d}" for c, d, _ in WRONG_TYPE])
def test_wrong_kind_of_path(command, dest, kind, good, capsys):
    """A directory where a file belongs; a plain file where a directory or model belongs."""
    bad = str(good["dir"] if kind in ("file", "files") else good["file"])
    code, _, err = run_cli(argv_for(command, dest, bad, good), capsys)
    reason = "is a directory" if kind in ("file", "files") else "is a file"
    assert_one_line(code, err, option_of(command, dest), bad, reason, command)


def test_run_dir_without_metrics(good, capsys):
    code, _, err = run_cli(["plot", str(good["dir"])], capsys)
    assert_one_line(code, err, "RUN_DIR", str(good["dir"] / "metrics.jsonl"), "no such file", "plot")


def test_directory_that_is_not_a_model(good, capsys):
    code, _, err = run_cli(["embed", str(good["dir"]), "--input", str(good["file"]), "--output", "x.npy"], capsys)
    assert_one_line(code, err, "MODEL", str(good["dir"]), "not a model directory", "embed")


def test_named_adapter_path_is_checked(good, capsys, tmp_path):
    missing = str(tmp_path / "no-adapter")
    code, _, err = run_cli(["serve", str(good["model"]), "--adapter", f"sst={missing}"], capsys)
    assert_one_line(code, err, "--adapter", missing, "no such directory", "serve")


@pytest.mark.parametrize("command,dest,kind", CASES, ids=[f"{c}-{d}" for c, d, _ in CASES])
def test_unreadable_path(command, dest, kind, good, capsys, tmp_path, monkeypatch):
    """chmod 000. As root every file is readable, so there the permission check itself is made to fail
    (os.access says no) for that one path: the same message path, exercised without a real denial."""
    is_dir = kind in ("dir", "run_dir", "model", "models", "model_or_preset", "tokenizer", "adapters")
    target = tmp_path / ("locked" if is_dir else "locked.txt")
    if is_dir:
        target.mkdir()
        (target / "config.json").write_text("{}")
    else:
        target.write_text("secret\n")
    target.chmod(0)
    try:
        if IS_ROOT:
            real_access = os.access
            monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == target
                                else real_access(p, mode, **kw))
        code, _, err = run_cli(argv_for(command, dest, str(target), good), capsys)
    finally:
        target.chmod(0o700)
    assert_one_line(code, err, option_of(command, dest), str(target), "permission denied", command)


@pytest.mark.skipif(IS_ROOT, reason="running as root: chmod 000 does not stop root from reading, so the "
                                    "real-denial case cannot happen here (the os.access variant above runs)")
def test_unreadable_file_really_denied(good, capsys, tmp_path):
    target = tmp_path / "locked.txt"
    target.write_text("secret\n")
    target.chmod(0)
    try:
        code, _, err = run_cli(["embed", str(good["model"]), "--input", str(target), "--output", "x.npy"], capsys)
    finally:
        target.chmod(0o600)
    assert_one_line(code, err, "--input", str(target), "permission denied", "embed")


def test_comma_separated_train_files_each_checked(good, capsys, tmp_path):
    missing = str(tmp_path / "b.tsv")
    code, _, err = run_cli(["finetune", "sst2", "--model", str(good["model"]), "--output", str(tmp_path / "o"),
                            "--train", f"{good['file']},{missing}"], capsys)
    assert_one_line(code, err, "--train", missing, "no such file", "finetune")


def test_preset_names_are_not_paths(capsys):
    assert main(["info", "bert-tiny"]) == 0


def test_multi_line_errors_are_folded_to_one_line(capsys, monkeypatch):
    import attnlab.cli.info as info

    def boom(args):
        raise ValueError("first\nsecond\n\nthird")
    monkeypatch.setattr(info, "run", boom)
    code, _, err = run_cli(["info", "bert-tiny"], capsys)
    assert code == 1 and err == "attnlab info: error: first second third\n"


def _subprocess(args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "attnlab", *args], capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=120)


def test_real_process_one_line_and_debug_traceback(tmp_path):
    missing = tmp_path / "nope.txt"
    proc = _subprocess(["embed", "minilm-not-here", "--input", str(missing), "--output", str(tmp_path / "v")])
    assert proc.returncode != 0
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("attnlab embed: error: MODEL minilm-not-here: ")
    debug = _subprocess(["embed", "--debug", "minilm-not-here", "--input", str(missing),
                         "--output", str(tmp_path / "v")])
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "PathError" in debug.stderr
