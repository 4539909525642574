"""Sharded data parallelism (FSDP) and world-size-free checkpoints for the Trainer.

`train.parallel=fsdp` shards every Transformer block and then the rest of the model with PyTorch's
`fully_shard` (FSDP2, Zhao et al. 2023): each process holds 1/N of the weights, gradients and AdamW
moments, and a block's full weights exist only while it runs (all-gather before, reduce-scatter of the
gradients after). The maths is data parallelism's: the same global batch gives the same step as DDP.

Checkpoints of an FSDP run are written with `torch.distributed.checkpoint` (DCP): every process writes
its own shards plus shared metadata that records which slice of which tensor each file holds, so a run
saved by N processes loads into M (the loader asks DCP for the slices it now owns). The same layout is
used with one process, so 2 -> 1 and 1 -> 2 both work.

    OUTPUT/checkpoints/step-000100/
        dcp/            model weights + optimizer state (DCP: .metadata + one __R_0.distcp per rank)
        trainer.pt      scheduler, step, per-rank RNG and data position (as for DDP checkpoints)

The directory is assembled under a hidden temporary name and renamed, as `checkpoint.save_checkpoint`
does; the final model for `attnlab.load` is gathered to rank 0 (`full_model`) at the end of a run.
"""
from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from .checkpoint import _fsync_tree, publish, write_error

PARALLEL = ("ddp", "fsdp")


def shard(model: torch.nn.Module) -> int:
    """Shard each Transformer block (one all-gather per block in forward and backward), then the root,
    which keeps the embeddings, the heads and their tied matrices together in one unit. Returns the
    number of sharded units."""
    from torch.distributed.fsdp import fully_shard

    from ..nn.block import Block
    seen: set[int] = set()
    for module in model.modules():
        if isinstance(module, Block) and id(module) not in seen:  # ALBERT's one shared block: once
            seen.add(id(module))
            fully_shard(module)
    fully_shard(model)
    return len(seen) + 1


def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule
    return isinstance(model, FSDPModule)


def local_norm(norm):
    """clip_grad_norm_ of sharded gradients returns a DTensor; the number itself is the same everywhere."""
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


def full_model(model: torch.nn.Module, rank: int):
    """A plain (unsharded) copy of an FSDP model on rank 0, None elsewhere: a collective, every rank calls
    it. Its weights are gathered once (DCP's full state dict, offloaded to CPU); the model itself is
    returned when it is not sharded."""
    if not is_sharded(model):
        return model
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank != 0:
        return None
    from torch.distributed.fsdp import FSDPModule
    # fully_shard swaps the model's class for a subclass of (FSDPModule, its class): build the original
    cls = next(c for c in type(model).__mro__[1:] if not issubclass(c, FSDPModule))
    with torch.device("meta"):
        replica = cls(model.config)
    replica.to_empty(device="cpu")
    replica.load_state_dict(full)
    if hasattr(replica, "tie_weights"):
        replica.tie_weights()
    return replica


def _state(model, optimizer):
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optimizer": optim_sd}


def save_sharded(output_dir: Path, step: int, model, optimizer, trainer_state: dict, keep_last: int,
                 rank: int, world: int) -> Path:
    """Every rank writes its shards of the weights and optimizer into one temporary directory; rank 0
    adds trainer.pt and renames it into place. A collective: every rank calls it."""
    import torch.distributed.checkpoint as dcp
    root = Path(output_dir) / "checkpoints"
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-step-{step:06d}-dcp"  # one name every rank knows
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
    _barrier(world)
    error = None
    try:
        with warnings.catch_warnings():  # one process: DCP says it assumes so, which is the point
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.save(_state(model, optimizer), checkpoint_id=str(tmp / "dcp"), no_dist=world == 1)
        if rank == 0:
            torch.save(trainer_state, tmp / "trainer.pt")
            _fsync_tree(tmp)
    except OSError as err:
        error = err
    failed = _any(error is not None, world)
    if failed:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        why = (error.strerror or str(error)) if error is not None else "another process could not write its shard"
        raise write_error(output_dir, final, why, getattr(error, "errno", None)) from error
    if rank == 0:
        publish(tmp, final, step, keep_last)
    _barrier(world)
    return final


def load_sharded(path: Path, model, optimizer) -> dict:
    """Fill the (sharded or plain) model and its optimizer from a DCP checkpoint written by any number of
    processes; returns trainer.pt's state."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict
    if not (path / "dcp" / ".metadata").exists():
        raise ValueError(f"{path}: not a train.parallel=fsdp checkpoint (no dcp/.metadata); "
                         "resume it with train.parallel=ddp")
    state = _state(model, optimizer)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=str(path / "dcp"), no_dist=not dist.is_initialized())
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    if hasattr(model, "tie_weights") and not is_sharded(model):
        model.tie_weights()
    return torch.load(path / "trainer.pt", map_location="cpu", weights_only=True)


def _barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


def _any(flag: bool, world: int) -> bool:
    if world == 1:
        return flag
    t = torch.tensor([float(flag)])
    dist.all_reduce(t)
    return bool(t.item() > 0)
