"""attnlab installs like any Python package: the wheel built from the source holds every file the code reads at
run time, and installed into a fresh virtual environment it runs from a folder outside the checkout, with no
ATTNLAB_DATA: --version, embed, generate, finetune on the user's own CSV, predict, and serve (/health).

How the environment is made (measured on 2 cores shared with other work: a fresh venv given torch==2.13.0 from
the local wheel and then the wheel's dependencies took 10 minutes, far over a test's budget, so they are linked):
- `python -m venv --without-pip` (the test's own pip installs into it with `pip --python`);
- the dependencies (torch, numpy, tokenizers, fastapi, ...) and the two model packages are the ones already
  installed beside the test, linked into the new venv through a .pth file naming a folder of symlinks that
  leaves out attnlab itself (its editable install) - so the only attnlab the venv can import is the wheel's;
- `pip install --no-index attnlab-*.whl[serve]`: pip checks that every requirement (the serve extra too) is
  met, and could not download one if it were not.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

import attnlab

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


def _source_copy(dst: Path) -> Path:
    """What an sdist holds, copied, so that building writes nothing into the checkout."""
    dst.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (REPO / name).exists():
            shutil.copy2(REPO / name, dst / name)
    shutil.copytree(REPO / "attnlab", dst / "attnlab", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dst


def _run(cmd: list[str], cwd: Path, env: dict, log: list[str], timeout: float = 300, check: bool = True):
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    log.append(f"$ {' '.join(cmd)}\n{out.stdout}{out.stderr}[exit {out.returncode}]\n")
    if check and out.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {out.returncode}:\n{out.stdout}\n{out.stderr}")
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_wheel_installs_and_runs_outside_the_checkout(tmp_path, minilm):
    if not (REPO / "LICENSE").exists():
        pytest.fail("LICENSE is missing: pyproject.toml's license-files names it")
    log: list[str] = []
    env = {k: v for k, v in os.environ.items() if k not in ("ATTNLAB_DATA", "PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1")

    # the wheel, built without network from a copy of the source
    src = _source_copy(tmp_path / "src")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(src), "-w",
          str(tmp_path / "dist")], tmp_path, env, log)
    (wheel,) = (tmp_path / "dist").glob("attnlab-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    data_files = {p.relative_to(src).as_posix() for p in (src / "attnlab").rglob("*")
                  if p.is_file() and p.suffix not in (".py", ".pyc")}
    assert "attnlab/py.typed" in data_files and data_files <= names, sorted(data_files - names)
    meta = zipfile.ZipFile(wheel).read(f"attnlab-{attnlab.__version__}.dist-info/METADATA").decode()
    requires = [l for l in meta.splitlines() if l.startswith("Requires-Dist:")]
    assert not any("fastapi" in r and "extra ==" not in r for r in requires)  # the server is an extra
    assert "Provides-Extra: serve" in meta and "Provides-Extra: hf" in meta

    # a fresh venv; dependencies linked from this environment, attnlab left out
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, env, log)
    python = venv / "bin" / "python"
    site = Path(subprocess.check_output([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                        text=True).strip())
    here = Path(sysconfig.get_path("purelib"))
    deps = tmp_path / "deps"
    deps.mkdir()
    for entry in here.iterdir():
        if not (entry.name.startswith(("attnlab", "__editable__", "_attnlab")) or entry.suffix == ".pth"):
            (deps / entry.name).symlink_to(entry)
    (site / "linked-deps.pth").write_text(f"{deps}\n")
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-index",
          f"{wheel}[serve]"], tmp_path, env, log, timeout=240)

    work = tmp_path / "work"  # outside the checkout
    work.mkdir()
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    cli = str(venv / "bin" / "attnlab")
    where = _run([str(python), "-c", "import attnlab; print(attnlab.__file__)"], work, env, log).stdout.strip()
    assert Path(where).is_relative_to(site), where
    assert _run([cli, "--version"], work, env, log).stdout.strip() == f"attnlab {attnlab.__version__}"

    (work / "in.txt").write_text("cheap pills click here\nthe meeting moved to friday\n")
    _run([cli, "embed", "minilm", "--input", "in.txt", "--output", "v.npy"], work, env, log)
    import numpy as np
    assert np.load(work / "v.npy").shape == (2, 384)
    out = _run([cli, "generate", "smollm2", "--prompt", "The capital of France is", "--max-new-tokens", "4"],
               work, env, log).stdout
    assert out.strip(), "generate printed no continuation"

    rows = [("win a free prize now", "spam"), ("see you at lunch tomorrow", "ham"), ("cheap pills click here", "spam"),
            ("the meeting moved to friday", "ham")] * 5
    (work / "own.csv").write_text("text,label\n" + "".join(f"{t},{l}\n" for t, l in rows))
    _run([cli, "finetune", "text-classification", "--model", "minilm", "--train", "own.csv", "--output", "m",
          "--epochs", "1", "--batch-size", "8", "--max-length", "16", "--no-progress"], work, env, log)
    summary = json.loads((work / "m" / "metrics.json").read_text())
    assert summary["task"] == "text-classification" and summary["steps"] >= 1
    # MiniLM's mean-pooling head is saved in attnlab's own layout (config.json cannot say "mean")
    saved = json.loads((work / "m" / "attnlab_config.json").read_text())
    assert saved["extra"]["id2label"] == {"0": "ham", "1": "spam"}
    _run([cli, "predict", "text-classification", "--model", "m", "--input", "in.txt", "--output", "p.txt"],
         work, env, log)
    assert set((work / "p.txt").read_text().split()) <= {"spam", "ham"}
    # no data beside an installed package: a preset without --train says what to pass
    missing = _run([cli, "finetune", "mrpc", "--model", "minilm", "--output", "x"], work, env, log, check=False)
    assert missing.returncode == 1 and "no training file: pass --train FILE (or set ATTNLAB_DATA)" in missing.stderr

    port = _free_port()
    server = subprocess.Popen([cli, "serve", "minilm", "--port", str(port)], cwd=work, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline, health = time.time() + 120, None
        while time.time() < deadline and server.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    health = (r.status, json.loads(r.read()))
                    break
            except OSError:
                time.sleep(0.5)
        assert health is not None and health[0] == 200, f"no /health answer; server exit {server.poll()}"
        log.append(f"$ attnlab serve minilm --port {port}  (GET /health)\n{health}\n")
    finally:
        server.terminate()
        try:
            log.append(server.communicate(timeout=30)[0])
        except subprocess.TimeoutExpired:
            server.kill()
    (tmp_path / "transcript.txt").write_text("\n".join(log))
