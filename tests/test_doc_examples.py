"""Every ```python and ```sh/```bash/```shell/```console block in README.md, CONTRIBUTING.md and docs/**/*.md
runs, or says why not. The conventions, for whoever writes the pages:

- Each page runs in a fresh directory of its own (files written there vanish afterwards), blocks in page order.
  `../shared/data` resolves to the real data (also $ATTNLAB_DATA), and `configs/`, `examples/`,
  `benchmarks/` to the repository's.
- ```python blocks of one page share one namespace, in order. A line `EXPR  # => VALUE` is checked: VALUE is
  a Python literal compared with EXPR's value (a torch.Size or tensor as a tuple/list/number; a float
  written with n decimals matches to n decimals), or otherwise the text EXPR prints (or its str()).
- Shell blocks: every line is one `attnlab ...` command (`$ attnlab ...` in a console block, whose other lines
  are output and are not run; `VAR=value attnlab ...`, pipes, redirections and a trailing `\\` continuation
  are fine), or one of printf, echo, mkdir, cat, head, tail, wc, ls to make or show an input; each must exit 0.
  Comments and blank lines are skipped. A block with anything else (`pip install`, `make`, `curl`, `python`,
  `attnlab serve`, which never exits) must be marked.
- `<!-- not run: REASON -->` on the line(s) just before a fence skips that block; the reason is required.
- A hidden input file for the examples: `<!-- file: NAME` on one line, its text on the next lines, `-->` alone
  on the last line; it is written into the page's directory at that point.
- Budget: all pages together run in about 90 s on one core (`make test` runs them), so examples use tiny
  inputs and the packaged models (`minilm`, `smollm2`); mark anything slower with a reason.
"""
from __future__ import annotations

import ast
import contextlib
import io
import json
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUN_LANGS = {"python": "python", "py": "python", "sh": "shell", "bash": "shell", "shell": "shell",
             "console": "console"}
PAGE_TIMEOUT = float(os.environ.get("ATTNLAB_DOC_EXAMPLE_TIMEOUT", 120))  # seconds per page
SHELL_SYNTAX = re.compile(r"[|&;<>`$]")  # a line with these goes through bash; plain ones run in-process
COMMAND = re.compile(r"^(?:\w+=\S*\s+)*attnlab(?:\s|$)")
# harmless commands a page may use to make or show its inputs, run as written
SETUP = re.compile(r"^(?:printf|echo|mkdir|cat|head|tail|wc|ls)(?:\s|$)")


@dataclass
class Block:
    kind: str        # python | shell | file
    line: int        # 1-based line of the opening fence (or of the file comment)
    text: str
    skip: str | None = None  # the not-run reason
    name: str = ""   # file blocks: the file's name


def parse(text: str) -> list[Block]:
    """The page's runnable blocks and hidden files, in order; a not-run marker without a reason is an error."""
    lines = text.splitlines()
    blocks, i, last_marker = [], 0, None
    while i < len(lines):
        line = lines[i]
        marker = re.match(r"\s*<!--\s*not run:?(.*?)-->\s*$", line)
        if marker:
            if not marker.group(1).strip():
                raise ValueError(f"line {i + 1}: <!-- not run: --> needs a reason after the colon")
            last_marker = marker.group(1).strip()
            i += 1
            continue
        hidden = re.match(r"\s*<!--\s*file:\s*(\S+)\s*$", line)
        if hidden:
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "-->"), None)
            if end is None:
                raise ValueError(f"line {i + 1}: <!-- file: {hidden.group(1)} has no closing --> line")
            blocks.append(Block("file", i + 1, "\n".join(lines[i + 1:end]) + "\n", name=hidden.group(1)))
            i, last_marker = end + 1, None
            continue
        fence = re.match(r"(\s*)(`{3,}|~{3,})\s*([\w+-]*)", line)
        if fence:
            indent, mark, lang = fence.groups()
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip().startswith(mark)
                        and not lines[j].strip().strip(mark[0])), len(lines))
            body = [ln[len(indent):] if ln.startswith(indent) else ln.lstrip() for ln in lines[i + 1:end]]
            kind = RUN_LANGS.get(lang.lower())
            if kind:
                blocks.append(Block(kind if kind == "python" else "shell", i + 1, "\n".join(body) + "\n",
                                    skip=last_marker))
                if kind == "console":  # commands are the `$ ` lines and their continuations; the rest is output
                    keep, continued = [], False
                    for ln in body:
                        if continued:
                            keep.append(ln)
                        elif ln.startswith("$ "):
                            keep.append(ln[2:])
                        else:
                            continue
                        continued = ln.rstrip().endswith("\\")
                    blocks[-1].text = "\n".join(keep) + "\n"
            i, last_marker = end + 1, None
            continue
        if line.strip():
            last_marker = None  # a marker covers only the fence right after it
        i += 1
    return blocks


def shell_commands(block: Block) -> list[tuple[int, str]]:
    """(line number, command) for each command of a shell block; anything but `attnlab ...` is an error."""
    out, pending, start = [], "", 0
    for k, raw in enumerate(block.text.splitlines()):
        line = raw.rstrip()
        if not pending:
            start = block.line + 1 + k
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        command, pending = (pending + line).strip(), ""
        if not command or command.startswith("#"):
            continue
        if not COMMAND.match(command) and not SETUP.match(command):
            raise ValueError(f"line {start}: `{command[:60]}` is not an `attnlab` command (nor printf, echo, "
                             "mkdir, cat, head, tail, wc, ls); put "
                             "<!-- not run: REASON --> just before the block")
        if re.match(r"^(?:\w+=\S*\s+)*attnlab\s+serve\b", command):
            raise ValueError(f"line {start}: `attnlab serve` runs until it is stopped; mark the block "
                             "<!-- not run: REASON -->")
        out.append((start, command))
    return out


def pages() -> list[Path]:
    """The pages with a block to run or to refuse (a page whose markers do not parse is kept: its test says why)."""
    fence = re.compile(r"^\s*(`{3,}|~{3,})\s*(" + "|".join(RUN_LANGS) + r")\s*$", re.M | re.I)
    found = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").rglob("*.md"))]
    return [p for p in found if p.exists() and fence.search(p.read_text(encoding="utf-8"))]


# ------------------------------------------------------------------------------ checks of `# =>` lines
def _plain(value):
    """A value as the literal a page would write: tensors and sizes become numbers, tuples and lists."""
    if type(value).__name__ == "Size":
        return tuple(value)
    if hasattr(value, "tolist") and hasattr(value, "shape"):  # a tensor or an ndarray
        value = value.tolist()
    return value


def _matches(actual, expected, written: str) -> bool:
    if isinstance(expected, float) or (isinstance(expected, int) and isinstance(actual, float)):
        decimals = len(written.split(".")[1]) if "." in written and "e" not in written.lower() else None
        if decimals is not None:
            return isinstance(actual, (int, float)) and abs(actual - expected) <= 0.5 * 10 ** -decimals + 1e-12
        return isinstance(actual, (int, float)) and math.isclose(actual, expected, rel_tol=1e-6)
    if isinstance(expected, (tuple, list)) and isinstance(actual, (tuple, list)):
        return len(actual) == len(expected) and all(_matches(a, e, repr(e)) for a, e in zip(actual, expected))
    return actual == expected


def check_line(expr: str, expected: str, scope: dict, where: str) -> None:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        value = eval(compile(expr, where, "eval"), scope)
    printed = buf.getvalue()
    sys.stdout.write(printed)
    actual = printed.strip() if value is None and printed else _plain(value)
    try:
        wanted = ast.literal_eval(expected)
    except (ValueError, SyntaxError):
        wanted = None
    else:
        if _matches(_plain(actual) if not isinstance(actual, str) else actual, wanted, expected):
            return
        if not isinstance(actual, str):
            raise AssertionError(f"{where}: `{expr}` is {actual!r}, the page says {expected}")
    text = actual if isinstance(actual, str) else str(value)
    if text.strip() != expected.strip():
        raise AssertionError(f"{where}: `{expr}` gives {text.strip()!r}, the page says {expected!r}")


def run_python(block: Block, scope: dict, page: str) -> None:
    tree = ast.parse(block.text, filename=page)
    src = block.text.splitlines()
    for stmt in tree.body:
        where = f"{page}:{block.line + stmt.lineno}"
        last = src[stmt.end_lineno - 1]
        arrow = re.search(r"#\s*=>\s*(.*)$", last)
        if arrow and not isinstance(stmt, ast.Expr):
            raise ValueError(f"{where}: `# =>` follows an expression only (this line is a statement)")
        if arrow:
            check_line(ast.get_source_segment(block.text, stmt), arrow.group(1), scope, where)
        else:
            exec(compile(ast.Module([stmt], []), where, "exec"), scope)


# ----------------------------------------------------------------------- the worker (one per page)
def worker(page: str, blocks: list[dict]) -> int:
    """Runs in a subprocess in the page's directory: python blocks in one scope, commands through the CLI."""
    from attnlab.cli import main as attnlab_main

    scope: dict = {"__name__": "__main__"}
    bindir = str(Path(sys.executable).parent)
    for raw in blocks:
        block = Block(**raw)
        started = time.time()
        print(f"--- {page}:{block.line} ({block.kind})", flush=True)
        if block.kind == "file":
            Path(block.name).parent.mkdir(parents=True, exist_ok=True)
            Path(block.name).write_text(block.text, encoding="utf-8")
            continue
        if block.kind == "python":
            run_python(block, scope, page)
        else:
            for line, command in shell_commands(block):
                print(f"$ {command}", flush=True)
                if SHELL_SYNTAX.search(command) or not command.startswith("attnlab"):
                    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
                    rc = subprocess.run(["bash", "-c", command], env=env).returncode
                else:
                    import shlex
                    try:
                        rc = attnlab_main(shlex.split(command, comments=True)[1:])
                    except SystemExit as err:  # argparse: a usage error is exit 2
                        rc = err.code if isinstance(err.code, int) else (0 if err.code is None else 1)
                sys.stdout.flush()
                sys.stderr.flush()
                if rc:
                    print(f"FAILED {page}:{line}: exit status {rc}", flush=True)
                    return 1
        print(f"    ({time.time() - started:.1f} s)", flush=True)
    return 0


def run_page(path: Path, tmp_path: Path, name: str | None = None,
             timeout: float = PAGE_TIMEOUT) -> subprocess.CompletedProcess:
    """The page's blocks in a worker process in tmp_path/work; `name` is how messages call the page."""
    from conftest import data_root

    blocks = [b for b in parse(path.read_text(encoding="utf-8")) if not b.skip]
    for b in blocks:  # refuse a bad shell block before spending a process on it
        if b.kind == "shell":
            shell_commands(b)
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "data").symlink_to(data_root().resolve(), target_is_directory=True)
    for folder in ("configs", "examples", "benchmarks"):
        (work / folder).symlink_to(REPO / folder, target_is_directory=True)
    env = dict(os.environ, ATTNLAB_DATA=str(data_root().resolve()),
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), MPLBACKEND="Agg")
    payload = json.dumps({"page": name or str(path.relative_to(REPO)), "blocks": [b.__dict__ for b in blocks]})
    return subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker"], input=payload, cwd=work,
                          env=env, capture_output=True, text=True, timeout=timeout)


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    job = json.load(sys.stdin)
    try:
        sys.exit(worker(job["page"], job["blocks"]))
    except Exception:  # the page's own error, with its page:line frame
        import traceback
        traceback.print_exc()
        sys.exit(1)


# ------------------------------------------------------------------------------------------- tests
import pytest  # noqa: E402  (the worker above runs without pytest's import cost)


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_page_examples_run(page, tmp_path, data_dir):
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = run_page(page, tmp_path)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = (result.stdout + result.stderr)[-6000:]
    assert result.returncode == 0, f"{page.relative_to(REPO)}: an example failed\n{out}"
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime  # the budget is CPU, not wall time
    print(f"{page.relative_to(REPO)}: {cpu:.1f} s of CPU\n{result.stdout[-3000:]}")


def test_readme_quickstart_is_run_and_checked():
    # the README's first Python block is the quickstart: it must run (no not-run marker) and check a value
    blocks = [b for b in parse((REPO / "README.md").read_text(encoding="utf-8")) if b.kind == "python"]
    assert blocks, "README.md has no ```python block"
    assert blocks[0].skip is None, f"README.md:{blocks[0].line}: the quickstart must run"
    assert re.search(r"#\s*=>", blocks[0].text), f"README.md:{blocks[0].line}: the quickstart checks no `# =>` value"


# ---------------------------------------------------------------- the runner itself, on made-up pages
def test_marker_needs_a_reason_and_covers_only_the_next_fence():
    with pytest.raises(ValueError, match="needs a reason"):
        parse("<!-- not run: -->\n```sh\nmake test\n```\n")
    blocks = parse("<!-- not run: installs packages -->\n\n```sh\npip install x\n```\n\n"
                   "```sh\nattnlab info bert-tiny\n```\n")
    assert [b.skip for b in blocks] == ["installs packages", None]
    text = "<!-- not run: later -->\nprose in between\n```python\nx = 1\n```\n"
    assert parse(text)[0].skip is None


def test_shell_blocks_accept_only_attnlab_commands():
    ok = parse("```console\n$ attnlab info bert-tiny \\\n    --seq-len 8\nparameters: 1\n```\n")[0]
    assert shell_commands(ok) == [(2, "attnlab info bert-tiny      --seq-len 8")]
    with pytest.raises(ValueError, match="not an `attnlab` command"):
        shell_commands(parse("```sh\nmake demo\n```\n")[0])
    made = parse("```sh\nprintf 'a\\nb\\n' > in.txt  # two lines\nattnlab embed minilm --input in.txt\n```\n")[0]
    assert [c for _, c in shell_commands(made)][1] == "attnlab embed minilm --input in.txt"
    with pytest.raises(ValueError, match="runs until it is stopped"):
        shell_commands(parse("```bash\nattnlab serve minilm --port 8000\n```\n")[0])


def test_arrow_lines_are_checked():
    scope: dict = {}
    run_python(parse("```python\nimport torch\nx = torch.zeros(2, 3)\nx.shape  # => (2, 3)\n"
                     "x.sum().item() + 0.123456  # => 0.12\nprint('hi')  # => hi\n'abc'  # => 'abc'\n```\n")[0],
               scope, "page.md")
    with pytest.raises(AssertionError, match=r"page.md:4: `x.shape` is \(2, 4\)"):
        run_python(parse("```python\nimport torch\nx = torch.zeros(2, 4)\nx.shape  # => (2, 3)\n```\n")[0],
                   {}, "page.md")
    with pytest.raises(AssertionError, match="the page says 0.13"):
        run_python(parse("```python\n0.123  # => 0.13\n```\n")[0], {}, "page.md")
    with pytest.raises(ValueError, match="follows an expression only"):
        run_python(parse("```python\ny = 3  # => 3\n```\n")[0], {}, "page.md")


def test_a_failing_command_fails_its_page(tmp_path, data_dir):
    page = tmp_path / "page.md"
    page.write_text("<!-- file: notes/a.txt\nhello\n-->\n\n"
                    "```python\nopen('notes/a.txt').read()  # => 'hello\\n'\n```\n\n"
                    "```sh\nattnlab --version\nattnlab info no-such-model\n```\n", encoding="utf-8")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    result = run_page(page, run_dir, name="page.md")
    assert result.returncode == 1
    assert "attnlab 0." in result.stdout  # the first command ran (and printed the version)
    assert "$ attnlab info no-such-model" in result.stdout and "FAILED page.md:11: exit status" in result.stdout
