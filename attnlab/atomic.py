"""Files written whole: through a temporary file in the same directory, then renamed over the target, so a
killed run or a second process reading at the same moment finds the old file or the new one, never half of
one. The bottom layer (no torch), so that every layer can write this way: checkpoints (interop), shard
metadata (data), the bf16 probe's cache (nn/precision)."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Callable


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _umask()  # read once at import: os.umask can only be read by setting it


def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """`write(tmp)` fills a temporary file beside `path`, which is synced and renamed to `path`; on any
    failure the temporary file is removed and the error raised (`path` unchanged)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes it 0600; the result should read like any written file
    try:
        write(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """`text` (UTF-8) written whole to `path`."""
    atomic_write(Path(path), lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def atomic_write_json(path: Path, data, indent: int | None = None) -> None:
    """`data` as JSON (a final newline when indented) written whole to `path`."""
    atomic_write_text(path, json.dumps(data, indent=indent) + ("\n" if indent is not None else ""))
