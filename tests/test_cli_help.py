"""`attnlab --help` and every `attnlab COMMAND --help` answer without importing torch, list what they
should, fit a screen, show no measured figures, and show examples that name real options."""
from __future__ import annotations

import importlib
import json
import pkgutil
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import attnlab
import attnlab.cli as cli
from attnlab.cli import GROUPS, TABLE, build_parser, main

REPO = Path(__file__).resolve().parents[1]
COMMANDS = list(TABLE)
HEAVY = ("torch", "numpy", "fastapi", "transformers", "tokenizers", "safetensors")
# Every docs page a help text may point at: ours, and the pages of the docs site's guides.
DOC_PAGES = {"docs/guides/" + p for p in (
    "embeddings.md", "fine-tuning.md", "fine-tuning-defaults.md", "generation-and-serving.md",
    "adapters-sft-dpo.md", "pretraining-and-distillation.md", "inspection.md", "distributed.md",
    "command-details.md", "explorer.md")} | {"docs/research/index.md", "docs/guides/"}


def help_text(argv: list[str], capsys, monkeypatch) -> str:
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def examples(text: str) -> list[str]:
    """The lines of the help's "examples:" block (indented, up to the first blank line)."""
    lines = text.splitlines()
    start = lines.index("examples:") + 1
    block = []
    for line in lines[start:]:
        if not line.strip():
            break
        block.append(line.strip())
    return block


def test_the_table_is_every_command_module_with_its_name_and_help():
    found = {}
    for info in pkgutil.iter_modules(cli.__path__):
        module = importlib.import_module(f"attnlab.cli.{info.name}")
        if hasattr(module, "NAME") and hasattr(module, "run"):
            found[module.NAME] = (info.name, module.HELP)
    assert found == {name: (module, text) for name, (module, _, text) in TABLE.items()}
    assert {group for _, group, _ in TABLE.values()} == set(GROUPS)


def test_the_written_down_choices_are_the_librarys():
    from attnlab.cli.choices import DISTILL_STYLES, TASKS
    from attnlab.objectives.distill import STYLES
    from attnlab.tasks import TASK_NAMES
    assert TASKS == tuple(TASK_NAMES)
    assert DISTILL_STYLES == tuple(sorted(STYLES))


RUNNER = """
import io, json, sys, contextlib
from attnlab.cli import main
heavy = {}
for argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            main(argv)
        except SystemExit:
            pass
    heavy[" ".join(argv)] = sorted(m for m in %r if m in sys.modules)
print(json.dumps({"heavy": heavy, "cli": sorted(m for m in sys.modules if m.startswith("attnlab.cli."))}))
""" % (HEAVY,)


def run_helps(*argvs: list[str]) -> dict:
    out = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(argvs)], capture_output=True, text=True,
                         timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_no_help_imports_torch():
    argvs = [["--help"], ["--version"], *[[name, "--help"] for name in COMMANDS], ["tokenizer", "train", "--help"]]
    heavy = run_helps(*argvs)["heavy"]
    assert heavy == {" ".join(a): [] for a in argvs}  # cumulative: the first offender shows its name


def test_top_level_help_imports_no_command_and_a_command_only_its_own():
    assert run_helps(["--help"])["cli"] == []
    assert run_helps(["finetune", "--help"])["cli"] == ["attnlab.cli.choices", "attnlab.cli.finetune"]


def test_the_console_entry_answers_help_and_version_without_torch():
    code = ("import runpy, sys\nsys.argv = ['attnlab'] + sys.argv[1:]\n"
            "try:\n    runpy.run_module('attnlab', run_name='__main__')\nexcept SystemExit as e:\n"
            "    print('exit', e.code, 'torch' in sys.modules)")
    for argv, first in ((["--help"], "usage: attnlab"), (["--version"], f"attnlab {attnlab.__version__}")):
        out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60)
        assert out.stdout.startswith(first), out.stdout + out.stderr
        assert out.stdout.splitlines()[-1] == "exit 0 False"


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"attnlab {attnlab.__version__}\n"
    assert re.fullmatch(r"\d+\.\d+\.\d+", attnlab.__version__)


def test_top_level_help_groups_every_command(capsys, monkeypatch):
    text = help_text([], capsys, monkeypatch)
    lines = text.splitlines()
    for group in GROUPS:  # each group's header, then its commands in the table's order
        at = lines.index(f"{group}:")
        names = [n for n, (_, g, _) in TABLE.items() if g == group]
        assert [line.split()[0] for line in lines[at + 1:at + 1 + len(names)]] == names
    assert "examples:" in text and "attnlab COMMAND --help" in text
    assert len(lines) <= 80 and max(map(len, lines)) <= 100


def test_no_command_prints_help_and_an_unknown_one_names_the_choices(capsys):
    assert main([]) == 2
    assert "train:" in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        main(["no-such-command"])
    err = capsys.readouterr().err
    assert done.value.code == 2 and "invalid choice: 'no-such-command'" in err and "'finetune'" in err


@pytest.mark.parametrize("argv", [[name] for name in COMMANDS] + [["tokenizer", "train"]], ids=" ".join)
def test_each_command_help_fits_and_shows_no_measured_figures(argv, capsys, monkeypatch):
    text = help_text(argv, capsys, monkeypatch)
    lines = text.splitlines()
    assert len(lines) <= 80, f"{' '.join(argv)} --help: {len(lines)} lines at 100 columns"
    assert max(map(len, lines)) <= 100
    assert "\\" not in text  # no backslash continuations, no escaped text
    figures = re.findall(r"\d[\d.,]*\s*%|\d(?:\.\d+)?x\b|~\s*\d|\d+(?:\.\d+)?\s*(?:s|ms|min|minutes|seconds)\b"
                         r"|\d[\d.,]*\s*tok(?:ens)?/s", text)
    assert not [f for f in figures if f], f"measured figures in help: {figures}"
    assert not re.search(r"\bsession\b|#\d{2,}|/work/|experiments/", text)


def test_help_points_at_docs_that_are_there_or_agreed(capsys, monkeypatch):
    for name in COMMANDS:
        text = help_text([name], capsys, monkeypatch)
        for page in re.findall(r"docs/[\w./-]+", text):
            page = page.rstrip(".")
            assert page in DOC_PAGES, f"{name} --help points at {page}"
    for page in ("docs/guides/fine-tuning-defaults.md", "docs/guides/command-details.md"):
        assert (REPO / page).is_file()


@pytest.mark.parametrize("name", COMMANDS)
def test_every_example_names_real_options(name, capsys, monkeypatch):
    """Each example line parses with the full parser: a renamed or misspelt option fails here."""
    shown = examples(help_text([name], capsys, monkeypatch))
    assert 2 <= len(shown) <= 4, shown
    parser = build_parser()
    for line in shown:
        words = shlex.split(line, comments=True)
        assert words[0] == "attnlab", line
        try:
            args = parser.parse_args(words[1:])
        except SystemExit:
            pytest.fail(f"{name} --help example does not parse: {line}\n{capsys.readouterr().err}")
        assert args.command == words[1]


def test_examples_parse_check_can_fail(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["finetune", "sst2", "--output", "o", "--no-such-option"])
    capsys.readouterr()


def test_completion_script_lists_commands_and_options(capsys):
    assert main(["completion", "bash"]) == 0
    script = capsys.readouterr().out
    assert "finetune" in script and "--lora" in script and "evaluate-prompting" in script


def test_completion_without_shtab_says_how_to_get_it(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "shtab", None)  # import shtab now raises ImportError
    assert main(["completion", "zsh"]) == 1
    assert capsys.readouterr().err.strip() == ("attnlab completion: error: the shtab package is not installed "
                                               "(pip install shtab)")


def test_lazy_package_keeps_its_public_names():
    code = ("import sys, attnlab; assert 'torch' not in sys.modules; "
            "from attnlab import ModelConfig, preset, from_config, load, save, load_tokenizer; "
            "from attnlab import *; assert set(attnlab.__all__) <= set(dir(attnlab)); "
            "assert attnlab.PRESETS and attnlab.Encoder and attnlab.nn.__name__ == 'attnlab.nn'; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        attnlab.nope  # noqa: B018
