"""Training checkpoints that survive being killed at any moment.

    OUTPUT/checkpoints/step-000100/
        model/          config.json + model.safetensors in the Hugging Face layout (`attnlab.load` reads it)
        trainer.pt      optimizer, scheduler, step, and per rank: RNG states and data position

A checkpoint is assembled in a hidden temporary directory (`.tmp-step-N-PID`), every file and the
directory fsynced, and renamed into place in one step, so a crash (even SIGKILL) leaves either the
previous checkpoints alone or a complete new one; temporaries are ignored by `list_checkpoints` and
cleared by the next save. The newest `keep_last` checkpoints are kept: an old one is first renamed
out of sight (`.tmp-old-…`), then deleted, and the one just written is never pruned. A failed write
(a full disk) removes its temporary and raises `CheckpointWriteError` naming the checkpoint, the
cause and the last good checkpoint, which is left as it was.

Test hook (used by tests/reliability/test_training_faults.py): with ATTNLAB_TEST_CHECKPOINT_PAUSE=
"STEP:SECONDS" the save of step STEP sleeps that long after the temporary is complete and before the
rename, so a test can kill the process in the middle of a checkpoint write deterministically.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import torch

STEP_DIR = re.compile(r"^step-(\d+)$")
RAW_WEIGHTS = "attnlab_state.safetensors"  # our own names, for models no Hugging Face table describes


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_model(model, directory: Path) -> None:
    """Hugging Face layout when the model's family and head are known, else our own tensor names."""
    from ..config import ConfigError
    from ..interop.hf import FAMILIES, save_pretrained
    family = FAMILIES.get(model.config.model_type)
    if family is not None and model.hf_architecture in family.architectures:
        try:
            save_pretrained(model, directory)
            return
        except ConfigError:  # a switch the family's layout cannot express: keep our own names
            pass
    from safetensors.torch import save_file
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    seen: dict[int, str] = {}
    for k in list(tensors):  # a tied matrix is stored once; load_state_dict re-ties it
        ptr = tensors[k].data_ptr()
        if ptr in seen:
            del tensors[k]
        else:
            seen[ptr] = k
    save_file(tensors, str(directory / RAW_WEIGHTS), metadata={"format": "pt"})
    native = model.config.to_dict()
    native["extra"] = {**native["extra"], "attnlab_class": type(model).__name__}
    (directory / "attnlab_config.json").write_text(json.dumps(native, indent=2) + "\n")


def native_classes() -> dict[str, type]:
    """Every model class `attnlab_config.json` may name."""
    from .. import heads
    from ..models.base import Model
    found: dict[str, type] = {}
    todo = [Model]
    while todo:
        for sub in todo.pop().__subclasses__():
            found.setdefault(sub.__name__, sub)
            todo.append(sub)
    return found


def load_native(directory: Path, extra: dict | None = None):
    """A model saved in attnlab's own layout (attnlab_config.json + attnlab_state.safetensors)."""
    from ..config import ModelConfig
    from ..models import decoder, seq2seq  # noqa: F401  (register their classes as Model subclasses)
    path = directory / "attnlab_config.json"
    data = json.loads(path.read_text())
    name = data.get("extra", {}).pop("attnlab_class", "Encoder")
    cfg = ModelConfig.from_dict(data, source=str(path))
    cfg.extra.update(extra or {})
    classes = native_classes()
    if name not in classes:
        raise ValueError(f"{path}: unknown model class {name!r}")
    model = classes[name](cfg)
    load_model_weights(model, directory)
    return model


def load_model_weights(model, directory: Path) -> None:
    if (directory / RAW_WEIGHTS).exists():
        from ..interop.hf import read_safetensors  # header checked against the file first
        missing, unexpected = model.load_state_dict(read_safetensors(directory / RAW_WEIGHTS), strict=False)
        tied = {k for k in missing if k.endswith("lm_head.weight") or k.endswith("mlm.decoder.weight")}
        if set(missing) - tied or unexpected:
            raise ValueError(f"{directory}: checkpoint does not fit the model (missing {sorted(set(missing) - tied)}, "
                             f"unexpected {unexpected})")
        model.tie_weights()
        return
    from ..interop.hf import FAMILIES, load_hf_state_dict, read_state_dict
    family = FAMILIES[model.config.model_type]
    sd, source = read_state_dict(directory)
    load_hf_state_dict(model, sd, family, family.architectures[model.hf_architecture][1], source)


def list_checkpoints(output_dir: Path) -> list[Path]:
    """Finished checkpoints, oldest first."""
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := STEP_DIR.match(p.name))
             and (p / "trainer.pt").exists()]
    return [p for _, p in sorted(found)]


class CheckpointWriteError(OSError):
    """A checkpoint could not be written; the previous ones are untouched."""


def _fsync_tree(directory: Path) -> None:
    for sub, _, files in os.walk(directory):
        for name in files:
            with open(os.path.join(sub, name), "rb") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(Path(sub))


def _remove(path: Path, root: Path) -> None:
    """Rename out of sight first (atomic), then delete: a kill mid-delete never leaves a step-N
    directory that looks finished but is missing files."""
    doomed = root / f".tmp-old-{path.name}-{os.getpid()}"
    os.replace(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def _test_pause(step: int) -> None:
    hook = os.environ.get("ATTNLAB_TEST_CHECKPOINT_PAUSE", "")
    if hook and int(hook.split(":")[0]) == step:
        time.sleep(float(hook.split(":")[1]))


def save_checkpoint(output_dir: Path, step: int, model, state: dict, keep_last: int) -> Path:
    root = Path(output_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):  # left by a run killed while saving or pruning
        shutil.rmtree(stale, ignore_errors=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-step-{step:06d}-{os.getpid()}"
    try:
        save_model(model, tmp / "model")
        torch.save(state, tmp / "trainer.pt")
        _fsync_tree(tmp)
    except OSError as err:  # e.g. ENOSPC: free what was written, keep every finished checkpoint
        shutil.rmtree(tmp, ignore_errors=True)
        good = list_checkpoints(output_dir)
        last = f"the last good checkpoint, {good[-1]}, is intact" if good else "no earlier checkpoint exists"
        failure = CheckpointWriteError(f"could not write checkpoint {final}: {err.strerror or err}; {last}")
        failure.errno = err.errno
        raise failure from err
    _test_pause(step)
    if final.exists():  # the same step saved again (e.g. a new run in an old directory)
        _remove(final, root)
    os.replace(tmp, final)
    _fsync_dir(root)
    if keep_last > 0:
        finished = [p for p in list_checkpoints(output_dir) if p != final]
        for old in finished[:max(len(finished) - (keep_last - 1), 0)]:
            _remove(old, root)
        _fsync_dir(root)
    return final


def load_checkpoint(path: Path, model) -> dict:
    """Load weights into `model` and return the trainer state (weights_only: no pickled code runs)."""
    load_model_weights(model, path / "model")
    return torch.load(path / "trainer.pt", map_location="cpu", weights_only=True)
