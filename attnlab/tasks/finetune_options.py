"""What a fine-tuning run is told (`FinetuneOptions`): every option of `finetune` in one typed record, each
field with its default and what it does, checked as a whole before any data is read. `attnlab finetune` maps
its flags onto it; `finetune(task, model, output, options, **overrides)` runs it (tasks/finetune.py).

None means "follow the data" wherever a field allows it: the task's defaults (`Task.hyper`) and the rules of
tasks/defaults.py (the schedule for small data, SetFit below SETFIT_BELOW examples, the LM teacher) fill it in,
and the run's metrics.json says what ran.

    >>> FinetuneOptions(epochs=1, lr=3e-5).replace(seed=1).seed
    1
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import CLASSIFIER_POOLINGS

PRECISIONS = ("fp32", "bf16", "auto")
PARALLELS = ("ddp", "fsdp")
SETFIT_PAIRINGS = ("sampled", "all")


@dataclass(frozen=True)
class FinetuneOptions:
    """Every option of a fine-tuning run. A field's comment says what it does; None follows the data. Frozen:
    a record that passed `check` stays valid (`replace` makes a checked copy)."""
    # --- data (tasks/splits.read_splits) ---
    # training file(s), comma-separated; None: the task's own file
    train_file: str | Path | None = None
    # validation file; None: the task's dev file, else a part held out of the training file
    valid_file: str | Path | None = None
    # a labelled file the kept model is scored on after training (summary test_*): data that chose nothing
    test_file: str | Path | None = None
    # train on a seeded random subset of this many examples
    max_train_samples: int | None = None
    # validate on a seeded random subset of this many examples
    max_eval_samples: int | None = None
    # examples held out of the training file for validation; None: read_splits' default, 0: none
    holdout: int | None = None
    # --- schedule (None: the task's default, adapted to the data by defaults.default_schedule) ---
    # passes over the training data, fractions allowed; 0: SetFit's head alone (needs setfit_steps)
    epochs: float | None = None
    # peak learning rate (linear warmup, then linear decay)
    lr: float | None = None
    # examples per optimizer step (under torchrun: across all processes)
    batch_size: int | None = None
    # tokens per input; longer ones are cut
    max_length: int | None = None
    # the seed of the split, the batches and any fresh weights
    seed: int = 42
    # share of the steps spent warming the learning rate up
    warmup_ratio: float = 0.1
    # AdamW's weight decay (none on biases and norms)
    weight_decay: float = 0.01
    # < 1: each layer below the top learns at this times the rate of the one above (training/optim.py)
    layer_decay: float = 1.0
    # > 0: evaluate and keep a moving average of the weights of this decay; None: off (full-file teacher: 0.999)
    ema: float | None = None
    # also evaluate every N steps; None: at each epoch's end
    eval_every: int | None = None
    # stop after this many evaluations without a new best; None: never
    patience: int | None = None
    # stop training after this many minutes, keeping the best model so far (summary stopped_by_time)
    max_minutes: float | None = None
    # "fp32", "bf16" (autocast) or "auto" (bf16 where it trains faster: nn/precision); None: "auto" under an LM
    # teacher, for few labels (the SetFit rule) and for a sentence (pair) task from pretrained weights, else fp32
    precision: str | None = None
    # torch.compile the training step; batches pad to multiples of COMPILE_PAD tokens (few shapes)
    compile: bool = False
    # --- the model ---
    # keep the word embeddings fixed (half of MiniLM, costly to update); None: yes, but the full-file teacher's no
    freeze_embeddings: bool | None = None
    # the model's architecture and tokenizer with random weights (the baseline a pretrained model must beat)
    from_scratch: bool = False
    # what a sentence classifier reads: "cls" (pooled [CLS], BERT 4.1) or "mean"; None: the checkpoint's
    pooling: str | None = None
    # "probe": the classifier starts from a logistic regression on frozen vectors (LP-FT); None: "random"
    head_init: str | None = None
    # LoRA instead of full fine-tuning, e.g. dict(r=8, alpha=16); the adapter goes to output/adapter
    lora: dict | None = None
    # --- recipes on top of the fine-tune ---
    # steps of SetFit's contrastive pairs before the head (tasks/setfit.py); None: the few-label rule, 0: off
    setfit_steps: int | None = None
    # SetFit's pairs: "all" (every pair within a batch of sentences) or "sampled" (SetFit's sampler)
    setfit_pairs: str = "all"
    # spans of each sentence a first fine-tune labels for a fresh copy to train on (tasks/selftrain.py); 0: off
    self_train: int | None = None
    # in (0, 1): a fresh copy learns this share from a first fine-tune's soft targets (born-again); 0: off
    self_distill: float = 0.0
    # a causal LM teacher, e.g. "smollm2" (tasks/prompt_teacher.py); None: defaults.teacher_helps, "none": off
    teacher: str | None = None
    # --- task distillation: `model` is a fine-tuned teacher, the run trains a smaller student ---
    # the student's layers, started from every other teacher layer (Sanh et al. 2019)
    student_layers: int | None = None
    # a narrower student: embeddings, pooler and classifier through a PCA basis of the teacher's
    student_width: int | None = None
    # the narrower student's attention heads
    student_heads: int | None = None
    # an objectives.distill.DistillConfig (soft targets, hidden states, layer terms); None: its defaults
    distill: Any = None
    # --- checkpoints and processes ---
    # also write a training checkpoint to output/checkpoints every N steps; 0: none
    save_every: int = 0
    # continue exactly from the newest training checkpoint in the output
    resume: bool = False
    # under torchrun: "ddp" replicates the model, "fsdp" shards it
    parallel: str = "ddp"
    # progress bars on stderr
    progress: bool = True
    # a metrics.jsonl line every N steps
    log_every: int = 50
    # internal: (train path, train examples, validation examples, description, note) already read and split
    # (the self-training teacher's run reuses its caller's); the files are then not read
    splits: tuple | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Refuse a value no run could take, naming the field (what depends on the task is checked by the run)."""
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"finetune: {name}={getattr(self, name)!r} {why}")
        if self.pooling is not None and self.pooling not in CLASSIFIER_POOLINGS:
            raise ValueError(f"finetune: pooling={self.pooling!r} is not one of {', '.join(CLASSIFIER_POOLINGS)}")
        if self.head_init not in (None, "probe", "random"):
            raise ValueError(f"finetune: head_init={self.head_init!r} is not one of probe, random")
        if self.setfit_steps is not None and self.setfit_steps < 0:
            raise ValueError(f"finetune: setfit_steps={self.setfit_steps} must be 0 (off) or more")
        if self.self_train is not None and self.self_train < 0:
            raise ValueError(f"finetune: self_train={self.self_train} must be 0 (off) or more spans per sentence")
        if not 0 <= self.self_distill < 1:
            raise ValueError(f"finetune: self_distill={self.self_distill} must be in [0, 1) (0: off; the soft "
                             "targets' weight)")
        if self.setfit_pairs not in SETFIT_PAIRINGS:
            raise bad("setfit_pairs", f"is not one of {', '.join(SETFIT_PAIRINGS)}")
        if self.parallel not in PARALLELS:
            raise bad("parallel", f"is not one of {', '.join(PARALLELS)}")
        if self.precision is not None and self.precision not in PRECISIONS:
            raise bad("precision", f"is not one of {', '.join(PRECISIONS)} (or None: the default)")
        if self.ema is not None and not 0 <= self.ema < 1:
            raise bad("ema", "must be in [0, 1) (0: off; e.g. 0.999)")
        if not 0 < self.layer_decay <= 1:
            raise bad("layer_decay", "must be in (0, 1] (1: one rate for every layer)")
        if self.epochs is not None and not self.epochs >= 0:   # also refuses nan
            raise bad("epochs", "must be 0 or more")
        for name in ("lr", "max_minutes"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                raise bad(name, "must be more than 0")
        for name in ("batch_size", "max_length", "student_layers", "student_width", "student_heads"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise bad(name, "must be 1 or more")
        for name in ("save_every", "patience", "holdout", "eval_every", "max_train_samples", "max_eval_samples"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise bad(name, "must be 0 or more")
        if self.log_every < 1:
            raise bad("log_every", "must be 1 or more")

    def replace(self, **changes) -> "FinetuneOptions":
        """A copy with `changes` (FinetuneOptions fields), checked again; an unknown name is a TypeError naming it."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise TypeError(f"finetune: unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
                            f"(FinetuneOptions fields: {', '.join(sorted(known - {'splits'}))})")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """The options as given, JSON-ready (paths as text; a DistillConfig as its fields), for options.json."""
        out = {}
        for f in dataclasses.fields(self):
            if f.name == "splits":
                continue
            value = getattr(self, f.name)
            if isinstance(value, Path):
                value = str(value)
            elif dataclasses.is_dataclass(value) and not isinstance(value, type):
                value = dataclasses.asdict(value)
            out[f.name] = value
        return out
