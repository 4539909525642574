"""Files written whole (attnlab/atomic.py): a failed write leaves the old file and no temporary; the JSON
writer's text is what the readers expect; the bf16 probe's cache and the shard metadata write this way."""
from __future__ import annotations

import json
import os

import pytest

from attnlab import atomic
from attnlab.interop import files


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "meta.json"
    target.write_text("old")

    def half(tmp: str) -> None:
        open(tmp, "w").write("new, half writ")
        raise OSError("disk full")
    with pytest.raises(OSError, match="disk full"):
        atomic.atomic_write(target, half)
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["meta.json"]


def test_json_is_written_whole_as_the_readers_expect(tmp_path):
    atomic.atomic_write_json(tmp_path / "a.json", {"x": 1}, indent=2)
    assert (tmp_path / "a.json").read_text() == '{\n  "x": 1\n}\n'
    atomic.atomic_write_json(tmp_path / "b.json", {"x": 1})
    assert json.loads((tmp_path / "b.json").read_text()) == {"x": 1}
    with pytest.raises(TypeError):  # not JSON: nothing written, nothing left behind
        atomic.atomic_write_json(tmp_path / "c.json", {"x": object()})
    assert sorted(os.listdir(tmp_path)) == ["a.json", "b.json"]


def test_interop_writes_through_the_same_function():
    assert files.atomic_write is atomic.atomic_write


def test_the_probe_cache_is_written_whole_and_a_read_only_cache_only_costs_a_measurement(tmp_path, monkeypatch):
    """nn/precision keeps the bf16 probe's figure through atomic_write_json; a cache it cannot write leaves no
    temporary and the figure is still returned."""
    from attnlab.nn import precision
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    precision.bf16_matmul_speedup.cache_clear()
    try:
        figure = precision.bf16_matmul_speedup()
        kept = json.loads((tmp_path / "cache" / "bf16-speed.json").read_text())
        assert list(kept.values()) == [figure]
        assert os.listdir(tmp_path / "cache") == ["bf16-speed.json"]

        def refuse(path, write):
            raise PermissionError(f"{path}: read-only")
        monkeypatch.setattr(atomic, "atomic_write", refuse)
        monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "other"))
        precision.bf16_matmul_speedup.cache_clear()
        assert precision.bf16_matmul_speedup() > 0
        assert os.listdir(tmp_path / "other") == []
    finally:
        precision.bf16_matmul_speedup.cache_clear()
