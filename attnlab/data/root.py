"""Where the real data lives, decided in one place for every command that has default data files."""
from __future__ import annotations

import os
from pathlib import Path


def data_root() -> Path | None:
    """ATTNLAB_DATA when set; else ../shared/data beside a source checkout, when that folder exists; else None
    (an installed package has no data of its own: the user names the files)."""
    env = os.environ.get("ATTNLAB_DATA")
    if env:
        return Path(env).expanduser()
    checkout = Path(__file__).resolve().parents[2]
    beside = checkout.parent / "shared" / "data"
    # pyproject.toml marks a source checkout: in site-packages the same relative path means nothing
    if (checkout / "pyproject.toml").is_file() and beside.is_dir():
        return beside
    return None


def expand_data_root(text: str, where: str) -> str:
    """`text` with ${ATTNLAB_DATA} replaced by the data root; an error naming `where` when there is none."""
    if "${ATTNLAB_DATA}" not in text:
        return text
    root = data_root()
    if root is None:
        raise FileNotFoundError(f"{where}: {text} uses ${{ATTNLAB_DATA}}, but ATTNLAB_DATA is not set and there is "
                                "no ../shared/data beside a source checkout; set ATTNLAB_DATA to the data folder")
    return text.replace("${ATTNLAB_DATA}", str(root))
