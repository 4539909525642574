"""Training checkpoints that survive being killed at any moment.

    OUTPUT/checkpoints/step-000100/
        model/          the model as `attnlab.save` writes it (`attnlab.load` reads it)
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

import os
import re
import shutil
import time
from pathlib import Path
from typing import Callable

import torch

from ..interop.native import load_model_weights, save_model

STEP_DIR = re.compile(r"^step-(\d+)$")


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
        # the run's tokenizer beside the weights (as OUTPUT/model has it), so a checkpoint is a MODEL every
        # command takes (explore, viz, generate) without copying files around
        tokenizer = Path(output_dir) / "tokenizer"
        if tokenizer.is_dir():
            for f in tokenizer.iterdir():
                if f.is_file() and not (tmp / "model" / f.name).exists():
                    shutil.copy2(f, tmp / "model" / f.name)
        torch.save(state, tmp / "trainer.pt")
        _fsync_tree(tmp)
    except OSError as err:  # e.g. ENOSPC: free what was written, keep every finished checkpoint
        shutil.rmtree(tmp, ignore_errors=True)
        raise write_error(output_dir, final, err.strerror or str(err), err.errno) from err
    return publish(tmp, final, step, keep_last)


def write_error(output_dir: Path, final: Path, why: str, errno: int | None) -> CheckpointWriteError:
    """The one line a failed checkpoint write stops the run with: which checkpoint, why, and the last good one."""
    good = list_checkpoints(output_dir)
    last = f"the last good checkpoint, {good[-1]}, is intact" if good else "no earlier checkpoint exists"
    failure = CheckpointWriteError(f"could not write checkpoint {final}: {why}; {last}")
    failure.errno = errno
    return failure


def keep_best(save: Callable[[], None], directory: Path, step: int) -> None:
    """Write the best model so far into `directory` with `save()`. Every file there is replaced by one rename
    (weights first; interop.files.atomic_write), so a failed write - a full disk - leaves the model kept before
    whole; it stops the run with one line naming the step, the directory and the cause."""
    had = any(Path(directory).glob("*.safetensors"))
    try:
        save()
    except OSError as err:
        kept = "the model kept there before is left whole" if had else "no model was kept there yet"
        failure = OSError(f"could not write the best model (step {step}) to {directory}: "
                          f"{err.strerror or err}; {kept}")
        failure.errno = err.errno
        raise failure from err


def publish(tmp: Path, final: Path, step: int, keep_last: int) -> Path:
    """Rename a complete temporary checkpoint into place (one atomic step), then prune to `keep_last`."""
    root = final.parent
    _test_pause(step)
    if final.exists():  # the same step saved again (e.g. a new run in an old directory)
        _remove(final, root)
    os.replace(tmp, final)
    _fsync_dir(root)
    if keep_last > 0:
        finished = [p for p in list_checkpoints(root.parent) if p != final]
        for old in finished[:max(len(finished) - (keep_last - 1), 0)]:
            _remove(old, root)
        _fsync_dir(root)
    return final


def load_checkpoint(path: Path, model) -> dict:
    """Load weights into `model` and return the trainer state (weights_only: no pickled code runs)."""
    load_model_weights(model, path / "model")
    return torch.load(path / "trainer.pt", map_location="cpu", weights_only=True)
