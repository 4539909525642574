"""Training: the `Trainer` loop (trainer.py) and its options (`TrainArgs`, args.py), optimizer and schedules
(optim.py), crash-safe checkpoints (checkpoint.py), and the `attnlab pretrain` recipe runner (pretrain.py)."""
from .args import TrainArgs
from .optim import build_optimizer, lr_factor, param_groups
from .trainer import Trainer, distributed_context

__all__ = ["Trainer", "TrainArgs", "build_optimizer", "distributed_context", "lr_factor", "param_groups"]
