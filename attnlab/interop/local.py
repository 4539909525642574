"""Model look-up (`resolve` and the hub cache, in `attnlab/locate.py`: no torch there, so that `attnlab generate` on a
.gguf starts without it) and the sentence-transformers modules a checkpoint folder may carry."""
from __future__ import annotations

from pathlib import Path

from ..locate import (DOWNLOAD_PATTERNS, PACKAGED, cached_snapshot, download, hub_cache,  # noqa: F401
                      hub_offline, package_path, resolve, split_revision)


def sentence_pooling(name_or_path: str | Path) -> str | None:
    """The pooling a sentence-transformers checkpoint was trained to be read with (its modules.json points at
    a Pooling module whose config.json names the mode): "mean" or "cls"; None for a plain checkpoint, an
    unreadable file, or another mode (max, mean-sqrt-len). A module path leading out of the model folder is a
    CheckpointError naming modules.json."""
    import json
    path = resolve(name_or_path)
    folders = _module_folders(path)
    folder = next((f for kind, f in folders if kind.endswith("Pooling")), None)
    if folder is None:
        return None
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        modes = [mode for mode in ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens")
                 if config.get(f"pooling_mode_{mode}")]
    except (OSError, ValueError, AttributeError):
        return None
    return {("mean_tokens",): "mean", ("cls_token",): "cls"}.get(tuple(modes))


def _module_folders(path: Path) -> list[tuple[str, Path]]:
    """(module type, folder) of each module modules.json lists ([] when there is no readable modules.json).
    Each folder is a path read from a file, so it is confined to the model folder (files.inside)."""
    import json

    from .files import inside  # lazy: files imports torch, this module must not (`attnlab --help`)
    source = path / "modules.json"
    try:
        modules = json.loads(source.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if not isinstance(modules, list):
        return []
    out = []
    for module in modules:
        if not isinstance(module, dict):
            continue
        folder = module.get("path", "")
        if folder == "":  # the transformer itself: the model folder's own weights
            continue
        out.append((str(module.get("type", "")), inside(path, folder, source, "module path")))
    return out


def copy_sentence_modules(source: str | Path, directory: str | Path) -> str | None:
    """Give `directory` the sentence-transformers modules of `source` (modules.json, its Pooling and
    Normalize folders, the ST config files) when `source` has a pooling sentence_pooling reads, so that a
    checkpoint trained further (continued MLM pretraining) is still read with the pooling it came with.
    Returns the pooling mode copied, or None (nothing copied). Nothing is read from outside `source` nor
    written outside `directory`: module paths and symlinks leading out are a CheckpointError."""
    import shutil

    from .files import atomic_write, check_inside  # each file whole or absent, as every checkpoint file
    mode = sentence_pooling(source)
    if mode is None:
        return None
    src, dest = resolve(source), Path(directory)
    files = [src / name for name in ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")
             if (src / name).is_file()]
    for _, folder in _module_folders(src):
        if folder.is_dir():
            files += [f for f in sorted(folder.rglob("*")) if f.is_file()]
    copies = [(f, f.relative_to(src)) for f in files]
    for f, _ in copies:  # all checked before anything is written
        check_inside(f, src)
    for f, rel in copies:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        atomic_write(dest / rel, lambda tmp, f=f: shutil.copyfile(f, tmp))
    return mode
