"""What a training run is told (`TrainArgs`): one typed record of the Trainer's options, each with its default
and what it does, and `validate`, which names the option a wrong value came from (train.<name>, as a recipe
spells it)."""
from __future__ import annotations

from dataclasses import dataclass

from .optim import SCHEDULES
from .parallel import PARALLEL


@dataclass
class TrainArgs:
    output_dir: str = "runs/run"
    max_steps: int = 1000
    max_minutes: float = 0.0           # 0 = no limit; else stop (with a checkpoint) after this much training time
    grad_accum: int = 1                # micro-batches per optimizer step (per process)
    lr: float = 1e-4
    min_lr_ratio: float = 0.0
    warmup_steps: int = 0
    schedule: str = "linear"           # linear | cosine | constant
    weight_decay: float = 0.01
    layer_decay: float = 1.0           # < 1: each layer down learns at this times the rate above (training/optim.py)
    ema: float = 0.0                   # > 0: evaluate, keep and end with an exponential moving average of the
                                       # weights of this decay (Polyak averaging); 0 = the weights as trained
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-6
    clip_norm: float = 1.0             # 0 = no clipping
    precision: str = "fp32"            # fp32 | bf16 (autocast; weights and optimizer stay fp32) | auto (bf16
                                       # where the hardware has it: nn/precision.resolve_precision)
    eval_every: int = 0                # 0 = only after the last step
    save_every: int = 0                # 0 = only after the last step
    keep_last: int = 2                 # training checkpoints kept (0 = none written: a run too short to resume)
    log_every: int = 10
    seed: int = 0
    resume: bool = False
    progress: bool = True
    device: str = "auto"               # auto | cpu | cuda
    nan_policy: str = "stop"           # stop | skip: what a non-finite loss or gradient norm does
    max_skips: int = 10                # nan_policy=skip: stop once more steps than this were skipped
    best_metric: str = ""              # e.g. "accuracy": keep the model that scores best on eval_<best_metric>
    greater_is_better: bool = True
    patience: int = 0                  # > 0: stop after this many evaluations without a new best
    parallel: str = "ddp"              # ddp | fsdp: how several processes (torchrun) share the model
    compile: bool = False              # torch.compile the loss (forward; AOTAutograd compiles its backward)
    fused_adamw: bool = True           # AdamW(fused=True): one kernel per step where the build has it

    # what a resumed run must share with the run that wrote its checkpoint, else "resume" would quietly go on
    # with another run (grad_accum, max_minutes, parallel... may differ: FSDP resumes with another world size)
    SAME_RUN = ("max_steps", "lr", "warmup_steps", "schedule", "weight_decay", "layer_decay", "ema", "seed", "eval_every",
                "best_metric")

    def validate(self) -> None:
        def positive(name):
            if getattr(self, name) <= 0:
                raise ValueError(f"train.{name}={getattr(self, name)} must be positive")
        for name in ("max_steps", "grad_accum", "lr", "log_every"):
            positive(name)
        if self.save_every < 0:
            raise ValueError(f"train.save_every={self.save_every} must not be negative (0: only after the last step)")
        if self.keep_last < 0:
            raise ValueError(f"train.keep_last={self.keep_last} must not be negative")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"train.schedule={self.schedule!r}: expected one of {', '.join(SCHEDULES)}")
        if self.precision not in ("fp32", "bf16", "auto"):
            raise ValueError(f"train.precision={self.precision!r}: expected fp32, bf16 or auto")
        if not 0.0 < self.layer_decay <= 1.0:
            raise ValueError(f"train.layer_decay={self.layer_decay} must be in (0, 1] (1: one rate for every layer)")
        if not 0.0 <= self.ema < 1.0:
            raise ValueError(f"train.ema={self.ema} must be in [0, 1) (0: off; e.g. 0.999)")
        if self.ema and self.parallel == "fsdp":
            raise ValueError("train.ema averages whole weights: use it with train.parallel=ddp or one process")
        if self.warmup_steps < 0:
            raise ValueError(f"train.warmup_steps={self.warmup_steps} must not be negative")
        if self.nan_policy not in ("stop", "skip"):
            raise ValueError(f"train.nan_policy={self.nan_policy!r}: expected stop or skip")
        if self.max_skips < 0:
            raise ValueError(f"train.max_skips={self.max_skips} must not be negative")
        if self.parallel not in PARALLEL:
            raise ValueError(f"train.parallel={self.parallel!r}: expected one of {', '.join(PARALLEL)}")
        if self.patience < 0:
            raise ValueError(f"train.patience={self.patience} must not be negative")
        if self.patience and not self.best_metric:
            raise ValueError("train.patience needs train.best_metric (the metric that decides what is better)")
