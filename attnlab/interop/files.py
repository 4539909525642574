"""Checkpoint files, read defensively and written atomically: config.json, safetensors (the header is
checked against the file before a tensor is read), sharded indexes and pytorch_model.bin (tensors only)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ..atomic import _UMASK, atomic_write  # noqa: F401  (re-exported: checkpoints are written whole)
from ..config import CheckpointError, ConfigError, first_line  # noqa: F401  (re-exported)


# ----------------------------------------------------------------------------------- paths named by files
def confinement_root(directory: Path) -> Path:
    """The folder every file of the model in `directory` must resolve into: `directory` itself, except for a
    Hugging Face hub cache snapshot (models--ORG--NAME/snapshots/REV), whose files are symlinks into the same
    repository's ../../blobs: there the repository folder models--ORG--NAME is the root."""
    directory = Path(directory).resolve()
    repo = directory.parent.parent
    if directory.parent.name == "snapshots" and repo.name.startswith(("models--", "datasets--", "spaces--")):
        return repo
    return directory


def check_inside(target: Path, directory: Path) -> Path:
    """`target` (a file or folder of the model in `directory`) after following every symlink must stay
    under `confinement_root(directory)`: a symlink out of the model folder is not followed."""
    root = confinement_root(directory)
    if not Path(target).resolve().is_relative_to(root):
        raise CheckpointError(f"{target}: resolves outside the model folder {root} (a symlink out of it); "
                              "not read")
    return Path(target)


def inside(directory: Path, name, source: Path, field: str) -> Path:
    """`directory / name` for a relative path `name` read from the file `source` (its `field`).

    Two checks, because the two attacks differ: the name itself must be relative with no ".." (lexical, so
    "../../secret" is refused whatever exists on disk), and the path it names must resolve inside the model
    folder (symlinks). The second check allows the hub cache's snapshot links into ../../blobs, which a
    purely resolved check against the snapshot folder would refuse (see `confinement_root`)."""
    text = str(name)
    parts = text.replace("\\", "/").split("/")
    if not isinstance(name, str) or Path(text).is_absolute() or ".." in parts or text.startswith("\\"):
        raise CheckpointError(f"{source}: {field} {name!r} is not a relative path inside {directory}")
    return check_inside(Path(directory) / text, directory)


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: not found (a Hugging Face model directory needs config.json)") from None
    except (ValueError, UnicodeDecodeError, RecursionError) as err:  # also: nesting thousands deep, 5000-digit ints
        raise ConfigError(f"{path}: not valid JSON ({type(err).__name__}: {first_line(err):.200})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


# safetensors dtype -> bytes per element (sub-byte float formats are left to the library's own check)
SAFETENSORS_DTYPES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "F8_E4M3FNUZ": 1,
                      "F8_E5M2FNUZ": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4,
                      "C64": 8, "F64": 8, "I64": 8, "U64": 8, "F4": None, "F6_E2M3": None, "F6_E3M2": None}
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024  # the format's own limit


def check_safetensors(path: Path) -> None:
    """Check a safetensors header against the file before any tensor is read: every dtype known, every
    shape a list of non-negative integers, every byte range inside the file and of the size its shape
    and dtype need. The error names the file and the tensor (the library's own errors name neither)."""
    import struct
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path}: truncated safetensors file ({size} bytes, no header length)")
            (n,) = struct.unpack("<Q", head)
            if n > min(size - 8, MAX_SAFETENSORS_HEADER):
                raise CheckpointError(f"{path}: safetensors header length {n} exceeds the file ({size} bytes): "
                                      "truncated or not a safetensors file")
            raw = fh.read(n)
    except OSError as err:
        raise CheckpointError(f"{path}: cannot read ({err.strerror or err})") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        # ValueError also covers integers past Python's digit limit; RecursionError, nesting thousands deep
        raise CheckpointError(f"{path}: safetensors header is not valid JSON ({type(err).__name__}: "
                              f"{first_line(err):.200})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: safetensors header must be a JSON object, got {type(header).__name__}")
    data_len = size - 8 - n
    spans = []
    for name, info in header.items():
        if name == "__metadata__":  # the spec: a flat map of strings to strings
            if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
                raise CheckpointError(f"{path}: __metadata__ must map names to strings")
            continue
        where = f"{path}: tensor {name!r}"
        if not isinstance(info, dict):
            raise CheckpointError(f"{where}: header entry must be an object, got {type(info).__name__}")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if not isinstance(dtype, str) or dtype not in SAFETENSORS_DTYPES:
            raise CheckpointError(f"{where}: unknown dtype {dtype!r}; known: {', '.join(SAFETENSORS_DTYPES)}")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise CheckpointError(f"{where}: shape {shape!r} is not a list of non-negative integers")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
                or not 0 <= offsets[0] <= offsets[1]):
            raise CheckpointError(f"{where}: data_offsets {offsets!r} is not a [begin, end] pair with begin <= end")
        if offsets[1] > data_len:
            raise CheckpointError(f"{where}: bytes {offsets[0]}..{offsets[1]} lie beyond the end of the data "
                                  f"({data_len} bytes): the file is truncated or its header is wrong")
        itemsize = SAFETENSORS_DTYPES[dtype]
        if itemsize is not None:
            numel = 1
            for d in shape:
                numel *= d
            if offsets[1] - offsets[0] != numel * itemsize:
                raise CheckpointError(f"{where}: shape {shape} of {dtype} needs {numel * itemsize} bytes, "
                                      f"the header gives it {offsets[1] - offsets[0]}")
        spans.append((offsets[0], offsets[1], name))
    spans.sort()
    for (s0, e0, a), (s1, e1, b) in zip(spans, spans[1:]):
        if s1 < e0 and s1 < e1:  # two tensors sharing bytes (an empty tensor shares none)
            raise CheckpointError(f"{path}: tensors {a!r} (bytes {s0}..{e0}) and {b!r} (bytes {s1}..{e1}) overlap")


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of one safetensors file, after `check_safetensors`; any error names the file."""
    from safetensors.torch import load_file
    check_safetensors(path)
    try:
        return load_file(str(path))
    except Exception as err:  # safetensors raises its own error types; name the file
        raise CheckpointError(f"{path}: cannot read safetensors ({first_line(err)})") from None


def read_state_dict(directory: Path) -> tuple[dict[str, torch.Tensor], Path]:
    """model.safetensors (or a sharded index), else pytorch_model.bin loaded with weights_only=True:
    a pickle can run code on load, so nothing but tensors is accepted."""
    single, index = directory / "model.safetensors", directory / "model.safetensors.index.json"
    if single.exists():
        return read_safetensors(single), single
    if index.exists():
        weight_map = read_json(index).get("weight_map", {})
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise CheckpointError(f"{index}: weight_map must map tensor names to shard file names")
        sd: dict[str, torch.Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            if Path(shard).name != shard:  # a shard outside the directory ("../x") is not read
                raise CheckpointError(f"{index}: shard {shard!r} is not a file name inside {directory}")
            sd.update(read_safetensors(inside(directory, shard, index, "weight_map shard")))
        return sd, index
    binary = directory / "pytorch_model.bin"
    if binary.exists():
        try:
            sd = torch.load(binary, map_location="cpu", weights_only=True)
        except Exception as err:
            raise CheckpointError(f"{binary}: refused or unreadable; only plain tensors are loaded "
                                  f"(weights_only=True): {first_line(err)}") from None
        if not isinstance(sd, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                               for k, v in sd.items()):
            raise CheckpointError(f"{binary}: expected a mapping of tensor names to tensors")
        return sd, binary
    raise FileNotFoundError(f"{directory}: no weights found (looked for model.safetensors, "
                            "model.safetensors.index.json, pytorch_model.bin)")
