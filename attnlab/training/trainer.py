"""The training loop: plain PyTorch you can read top to bottom.

    from attnlab.training import Trainer, TrainArgs
    trainer = Trainer(model, TrainArgs(output_dir="runs/x", max_steps=1000, lr=3e-4),
                      train_data=batches,             # any iterable of dicts of tensors (re-iterated per epoch)
                      loss_fn=my_loss,                # (model, batch) -> loss, or (loss, sums); default: model(**batch).loss
                      eval_data=eval_batches,         # optional list/iterable of batches
                      metrics_fn=my_metrics)          # optional: summed eval `sums` -> {"accuracy": ...}
    trainer.train()                                   # returns the last evaluation's metrics

A task scored by decoding rather than by summed losses (GLUE, NER, QA) passes `evaluate_fn(model) ->
{"accuracy": ...}` instead of eval_data; with `best_metric` set, every evaluation that improves on it
hands the model to `on_best` (default: save it to OUTPUT/best), and `patience` stops the run after that
many evaluations without a new best (early stopping).

What one optimizer step does: `grad_accum` micro-batches, each forward under autocast (bf16 when
asked) and backward of loss / grad_accum; clip the global gradient norm; AdamW step; scheduler step.
Every `log_every` steps a line goes to OUTPUT/metrics.jsonl ({"step", "loss", "lr", "tokens_per_s" (of the
training steps: evaluations and checkpoints are not counted), "elapsed_s"}, and "expert_share" for a mixture
of experts); every `eval_every` steps the held-out batches are scored (keys "eval_*").

A non-finite loss (or gradient norm, when clipping) is caught before the optimizer step, so the
weights are never touched by it: with `nan_policy="stop"` (default) the run stops with an error
naming the step and the last good checkpoint; with `nan_policy="skip"` the step is skipped (no
weight or AdamW-moment update; the step count and learning-rate schedule still advance), logged as
{"step", "skipped", "skipped_steps"} and printed, until more than `max_skips` have been skipped.

Exact resume: a checkpoint holds weights, optimizer, scheduler, step, RNG states and the data position
(`train_data.state_dict()` when the iterable has one, else the number of batches consumed, which are
skipped on resume). Under `torchrun` the model is wrapped in DistributedDataParallel (gloo on CPU,
nccl on CUDA); each rank brings its own data (see attnlab.data.stream.BatchStream). With
`parallel="fsdp"` it is sharded instead (attnlab.training.parallel: fully_shard, checkpoints written
with torch.distributed.checkpoint, which resume with a different number of processes).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist

from ..interop.files import atomic_write
from ..interop.native import save_model
from . import parallel
from .checkpoint import keep_best, list_checkpoints, load_checkpoint, save_checkpoint
from .args import TrainArgs
from .optim import build_optimizer


def distributed_context() -> tuple[int, int, int]:
    """(rank, world_size, local_rank); initialises the process group when launched by torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0"))
    return 0, 1, 0


def default_loss(model, batch: dict) -> torch.Tensor:
    return model(**batch).loss


class Trainer:
    def __init__(self, model: torch.nn.Module, args: TrainArgs, train_data: Iterable, *,
                 loss_fn: Callable | None = None, eval_data: Iterable | None = None,
                 metrics_fn: Callable[[dict], dict] | None = None,
                 count_tokens: Callable[[dict], int] | None = None,
                 evaluate_fn: Callable[[torch.nn.Module], dict] | None = None,
                 on_best: Callable[[torch.nn.Module, dict], None] | None = None) -> None:
        args.validate()
        self.args, self.train_data, self.eval_data = args, train_data, eval_data
        self.evaluate_fn, self.on_best = evaluate_fn, on_best
        self.loss_fn, self.metrics_fn = loss_fn or default_loss, metrics_fn
        self.count_tokens = count_tokens or _count_tokens
        self.rank, self.world, local_rank = distributed_context()
        cuda = torch.cuda.is_available() and args.device != "cpu"
        if args.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("train.device=cuda but no CUDA device is available")
        self.device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
        self.output = Path(args.output_dir)
        from ..nn.precision import bf16_warning, resolve_precision, tune_malloc
        self.precision = resolve_precision(args.precision, self.device.type)  # what runs: fp32 or bf16
        if self.device.type == "cpu":
            tune_malloc()  # no fresh pages for every step's activations (nn/precision.py)
        if args.precision == "bf16" and self.device.type == "cpu" and self.rank == 0:
            if bf16_warning():
                print(f"train.precision=bf16: {bf16_warning()}", file=sys.stderr)
        torch.manual_seed(args.seed)
        self.model = model.to(self.device)
        self.ddp = None
        self.fsdp = args.parallel == "fsdp"
        if self.fsdp and self.world > 1:
            units = parallel.shard(self.model)
            if self.is_main:
                print(f"train.parallel=fsdp: {units} units sharded over {self.world} processes", file=sys.stderr)
        elif self.world > 1:
            self.ddp = torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=[self.device.index] if cuda else None)
        self.optimizer, self.scheduler = build_optimizer(
            self.model, lr=args.lr, weight_decay=args.weight_decay, betas=(args.beta1, args.beta2), eps=args.eps,
            warmup_steps=args.warmup_steps, max_steps=args.max_steps, schedule=args.schedule,
            min_lr_ratio=args.min_lr_ratio, fused=args.fused_adamw,
            layer_decay=args.layer_decay)
        self._compiled = None          # train.compile: the compiled loss, built at the first step
        # train.ema: the averaged copy of every trained weight (a tied weight once), updated after each step;
        # _ema_params are detached views of the weights (same storage and version counter as the parameters)
        trained = {id(p): p for p in self.model.parameters() if p.requires_grad}.values() if args.ema else ()
        self._ema_params = [p.detach() for p in trained]
        self._ema = [p.clone() for p in self._ema_params]
        self.step = 0
        self.batches_seen = 0
        self.skips = 0                 # steps skipped for a non-finite loss (nan_policy=skip)
        self.stopped_by = ""           # why train() ended before max_steps: "patience" or "max_minutes"
        self.last_eval: dict[str, float] = {}
        self.best: dict[str, float] = {}    # {"step", "eval_*"} of the best evaluation (args.best_metric)
        self.evals_since_best = 0

    # ------------------------------------------------------------------------------------ helpers
    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def _autocast(self):
        from ..nn.precision import autocast
        return autocast(self.precision, self.device.type)

    def _log(self, record: dict) -> None:
        if self.is_main:
            with open(self.output / "metrics.jsonl", "a") as fh:
                fh.write(json.dumps(record) + "\n")

    def _batches(self):
        """Micro-batches forever: a finite dataset is simply iterated again (the next epoch)."""
        while True:
            empty = True
            for batch in self.train_data:
                empty = False
                yield batch
            if empty:
                raise ValueError("train_data produced no batches")

    def _to_device(self, batch: dict) -> dict:
        return {k: v.to(self.device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}

    def _call_loss(self, model, batch) -> tuple[torch.Tensor, dict]:
        result = self.loss_fn(model, batch)
        if isinstance(result, tuple):
            return result
        return result, {"loss_sum": result.detach(), "n": torch.tensor(1.0)}

    def _step_loss(self, model, batch) -> tuple[torch.Tensor, dict]:
        """The training loss of one micro-batch; with train.compile, through the compiled loss. Token ids are
        range-checked here, outside the compiled region (the model skips its own check when compiled)."""
        if not self.args.compile:
            return self._call_loss(model, batch)
        if self._compiled is None:
            self._compiled = torch.compile(self._call_loss)
        ids = batch.get("input_ids")
        vocab = getattr(getattr(self.model, "config", None), "vocab_size", None)
        if torch.is_tensor(ids) and vocab and ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
            raise ValueError(f"token id outside the vocabulary (vocab_size={vocab}) in a training batch")
        return self._compiled(model, batch)

    def _mean_over_ranks(self, value: float) -> float:
        if self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return float(t) / self.world

    # ------------------------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        data = self.train_data.state_dict() if hasattr(self.train_data, "state_dict") else {"batches": self.batches_seen}
        mine = {"data": data, "torch_rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None}
        ranks = [None] * self.world
        if self.world > 1:
            dist.all_gather_object(ranks, mine)
        else:
            ranks = [mine]
        return {"step": self.step, "batches_seen": self.batches_seen, "skips": self.skips,
                "best": self.best, "evals_since_best": self.evals_since_best,
                "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(), "ranks": ranks,
                "world_size": self.world, "args": asdict(self.args),
                **({"ema": self._ema} if self._ema else {})}

    def save(self) -> Path | None:
        if self.args.keep_last == 0:
            return None
        state = self.state_dict()  # a collective under DDP: every rank takes part
        if self.fsdp:
            del state["optimizer"]  # in the DCP files, sharded
            return parallel.save_sharded(self.output, self.step, self.model, self.optimizer, state,
                                         self.args.keep_last, self.rank, self.world)
        path = None
        if self.is_main:
            path = save_checkpoint(self.output, self.step, self.model, state, self.args.keep_last)
        if self.world > 1:
            dist.barrier()
        return path

    def resume(self, path: Path | None = None) -> bool:
        found = list_checkpoints(self.output)
        path = path or (found[-1] if found else None)
        if path is None:
            return False
        if self.fsdp:
            state = parallel.load_sharded(path, self.model, self.optimizer)
        else:
            if (path / "dcp").is_dir():
                raise ValueError(f"{path}: written with train.parallel=fsdp (dcp/); resume it with train.parallel=fsdp")
            state = load_checkpoint(path, self.model)
            if state["world_size"] != self.world:
                raise ValueError(f"{path}: saved with {state['world_size']} processes, resuming with {self.world}; "
                                 "DDP checkpoints resume with the same number (train.parallel=fsdp ones with any)")
            self.optimizer.load_state_dict(state["optimizer"])
        self._same_run(path, state.get("args", {}))
        self.scheduler.load_state_dict(state["scheduler"])
        self.step, self.batches_seen = state["step"], state["batches_seen"]
        self.skips = state.get("skips", 0)
        if self._ema:
            if "ema" not in state:
                raise ValueError(f"cannot resume from {path}: it has no train.ema average (written without train.ema)")
            torch._foreach_copy_(self._ema, [e.to(self.device) for e in state["ema"]])
        self.best, self.evals_since_best = state.get("best", {}), state.get("evals_since_best", 0)
        # another world size (FSDP): the RNG of the saved rank with this number, or of the last one (with
        # dropout the random streams differ from an uninterrupted run); the data position is re-dealt
        mine = state["ranks"][min(self.rank, len(state["ranks"]) - 1)]
        torch.set_rng_state(mine["torch_rng"])
        if mine["cuda_rng"] is not None and state["world_size"] == self.world:
            torch.cuda.set_rng_state(mine["cuda_rng"], self.device)
        if state["world_size"] != self.world:
            if not hasattr(self.train_data, "load_rank_states"):
                raise ValueError(f"{path}: saved with {state['world_size']} processes, resuming with {self.world}, "
                                 f"but the training data ({type(self.train_data).__name__}) cannot be re-dealt")
            self.train_data.load_rank_states([r["data"] for r in state["ranks"]])
        elif hasattr(self.train_data, "load_state_dict"):
            self.train_data.load_state_dict(mine["data"])
        if self.is_main and (self.output / "metrics.jsonl").exists():  # drop lines logged after the checkpoint
            kept = [line for line in (self.output / "metrics.jsonl").read_text().splitlines()
                    if _logged_by(line, self.step)]
            atomic_write(self.output / "metrics.jsonl",
                         lambda tmp: Path(tmp).write_text("".join(line + "\n" for line in kept)))
        return True

    def _same_run(self, path: Path, saved: dict) -> None:
        """Refuse, before any training, to resume a checkpoint of another run (another step count, lr,
        seed...): one line naming the field and both values."""
        for name in TrainArgs.SAME_RUN:
            if name in saved and saved[name] != getattr(self.args, name):
                raise ValueError(f"cannot resume from {path}: it was written by a run with {name}={saved[name]!r}, "
                                 f"this one has {name}={getattr(self.args, name)!r}; resume with the options of "
                                 "that run (or start afresh without resume)")

    def _non_finite(self, loss: float, norm: torch.Tensor | None, bar) -> None:
        """Called before the optimizer step of step `self.step + 1`: stop, or count a skip."""
        step, args = self.step + 1, self.args
        what = f"loss became {loss}" if not math.isfinite(loss) else f"gradient norm became {float(norm)}"
        if args.nan_policy == "skip" and self.skips < args.max_skips:
            self.skips += 1
            self._log({"step": step, "skipped": what, "skipped_steps": self.skips})
            if self.is_main:
                bar.write(f"step {step}: {what}; step skipped ({self.skips} of train.max_skips={args.max_skips})",
                          file=sys.stderr)
            return
        found = list_checkpoints(self.output)
        last = f"last good checkpoint: {found[-1]}" if found else "no checkpoint was written yet"
        if self.best:
            last += f"; the best model so far (step {self.best['step']}) is kept"
        plural = "s" if self.skips != 1 else ""
        why = f" after {self.skips} skipped step{plural} (train.max_skips={args.max_skips})" if self.skips else ""
        raise FloatingPointError(f"{what} at step {step}{why}; stopped before updating the weights; {last}. "
                                 "Lower train.lr or check the data, then resume (train.resume=true); "
                                 "train.nan_policy=skip skips such steps")

    # ------------------------------------------------------------------------------------ averaging
    def _update_ema(self) -> None:
        """ema <- d * ema + (1 - d) * w, with d = min(train.ema, (1 + t) / (10 + t)) at update t: the short
        memory of the first steps keeps the average from dwelling on the pretrained start (as TensorFlow's
        ExponentialMovingAverage with num_updates)."""
        if self._ema:
            t = self.step
            decay = min(self.args.ema, (1 + t) / (10 + t))
            torch._foreach_lerp_(self._ema, self._ema_params, 1.0 - decay)

    @contextlib.contextmanager
    def averaged(self):
        """Within: the model holds the averaged weights (train.ema; nothing changes without it), so that an
        evaluation scores them and a new best saves them; after: the trained weights again."""
        if not self._ema:
            yield
            return
        params = self._ema_params
        trained = [p.clone() for p in params]
        torch._foreach_copy_(params, self._ema)
        try:
            yield
        finally:
            torch._foreach_copy_(params, trained)

    # ------------------------------------------------------------------------------------ loops
    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        if self.evaluate_fn is not None:
            self.model.eval()
            metrics = self.evaluate_fn(self.model)
            self.model.train()
            self.last_eval = {f"eval_{k}": float(v) for k, v in metrics.items()}
            return self.last_eval
        if self.eval_data is None:
            return {}
        self.model.eval()
        sums: dict[str, torch.Tensor] = {}
        batches = list(self.eval_data)
        rounds = math.ceil(len(batches) / self.world) * self.world if self.fsdp else len(batches)
        for i in range(rounds):
            if i % self.world != self.rank:
                continue
            # a sharded forward is a collective: a rank without a batch of its own in the last round
            # still runs one (and discards it), so every rank gathers the same blocks the same number of times
            with self._autocast():
                _, part = self._call_loss(self.model, self._to_device(batches[i % len(batches)]))
            if i >= len(batches):
                continue
            for k, v in part.items():
                sums[k] = sums.get(k, 0) + torch.as_tensor(v, dtype=torch.float64, device=self.device)
        if self.world > 1:
            keys = sorted(sums)
            flat = torch.stack([sums[k] for k in keys]) if keys else torch.zeros(0, dtype=torch.float64)
            dist.all_reduce(flat)
            sums = dict(zip(keys, flat))
        self.model.train()
        if not sums:
            return {}
        totals = {k: float(v) for k, v in sums.items()}
        metrics = self.metrics_fn(totals) if self.metrics_fn else {"loss": totals["loss_sum"] / max(totals["n"], 1)}
        self.last_eval = {f"eval_{k}": v for k, v in metrics.items()}
        return self.last_eval

    def train(self, until: int | None = None) -> dict[str, float]:
        """Train to args.max_steps, or stop early after step `until` with a checkpoint (a later
        `resume` continues exactly: the schedule still runs to max_steps)."""
        args = self.args
        stop = min(until or args.max_steps, args.max_steps)
        if self.is_main:
            self.output.mkdir(parents=True, exist_ok=True)
        if self.world > 1:
            dist.barrier()
        if args.resume and self.resume() and self.is_main:
            print(f"resumed from step {self.step}", file=sys.stderr)
        skip = 0 if hasattr(self.train_data, "load_state_dict") else self.batches_seen
        batches = self._batches()
        for _ in range(skip):  # a plain iterable has no position to restore: replay it
            next(batches)
        forward = self.ddp or self.model
        self.model.train()
        from tqdm import tqdm
        bar = tqdm(total=args.max_steps, initial=self.step, disable=not (args.progress and self.is_main),
                   desc="train", dynamic_ncols=True, file=sys.stderr)
        start, tokens_since, t_log = time.perf_counter(), 0, time.perf_counter()
        routed: dict[str, float] = {}
        while self.step < stop:
            loss_sum = 0.0
            for micro in range(args.grad_accum):
                batch = self._to_device(next(batches))
                self.batches_seen += 1
                tokens_since += self.count_tokens(batch)
                # skip the gradient all-reduce on all but the last micro-batch of the step
                sync = self.ddp.no_sync() if self.ddp is not None and micro < args.grad_accum - 1 \
                    else contextlib.nullcontext()
                with sync:
                    with self._autocast():
                        loss, parts = self._step_loss(forward, batch)
                    (loss / args.grad_accum).backward()
                for k, v in parts.items():  # a mixture of experts' routed tokens per expert (objectives.clm)
                    if k.startswith("expert_"):
                        routed[k] = routed.get(k, 0.0) + float(v)
                loss_sum = loss_sum + loss.detach()  # a tensor: no host sync per micro-batch
            loss_value = self._mean_over_ranks(float(loss_sum) / args.grad_accum)  # the same on every rank
            norm = None
            if args.clip_norm > 0:  # sharded gradients give a DTensor norm: local_norm makes it a plain number
                norm = parallel.local_norm(torch.nn.utils.clip_grad_norm_(self.model.parameters(), args.clip_norm))
            lr = self.optimizer.param_groups[0]["lr"]
            skipped = not math.isfinite(loss_value) or (norm is not None and not bool(torch.isfinite(norm)))
            if skipped:
                self._non_finite(loss_value, norm, bar)  # raises unless the step is to be skipped
            else:
                self.optimizer.step()
                self._update_ema()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.step += 1

            bar.update(1)
            if not skipped and (self.step % args.log_every == 0 or self.step == args.max_steps):
                now = time.perf_counter()
                tps = self._mean_over_ranks(tokens_since / max(now - t_log, 1e-9)) * self.world
                tokens_since, t_log = 0, now
                record = {"step": self.step, "loss": round(loss_value, 6), "lr": lr,
                          "tokens_per_s": round(tps, 1), "elapsed_s": round(now - start, 2)}
                if routed:  # each expert's share of the tokens routed since the last line (1/E each = balanced)
                    total = sum(routed.values()) or 1.0
                    record["expert_share"] = [round(routed[k] / total, 4) for k in sorted(routed, key=lambda k: int(k[7:]))]
                    routed = {}
                self._log(record)
                bar.set_postfix(loss=f"{loss_value:.4f}", tok_s=f"{tps:,.0f}")
            early_stop, paused = False, time.perf_counter()  # evaluation and checkpoints: not training time
            if (args.eval_every and self.step % args.eval_every == 0) or self.step == args.max_steps:
                with self.averaged():
                    early_stop = self._evaluated(self.evaluate(), bar)
            out_of_time = False
            if args.max_minutes > 0:  # every rank takes part, so all of them stop at the same step
                late = float(time.perf_counter() - start >= args.max_minutes * 60)
                out_of_time = self._mean_over_ranks(late) > 0
            if (args.save_every and self.step % args.save_every == 0) or self.step == stop or out_of_time \
                    or early_stop:
                self.save()
            t_log += time.perf_counter() - paused  # tokens_per_s counts training steps only
            if early_stop and self.step < stop:
                self.stopped_by = "patience"
                if self.is_main:
                    bar.write(f"stopped at step {self.step}: no better eval_{args.best_metric} in "
                              f"{self.evals_since_best} evaluations (train.patience={args.patience})", file=sys.stderr)
                break
            if out_of_time and self.step < stop:
                self.stopped_by = "max_minutes"
                if self.is_main:
                    bar.write(f"stopped at step {self.step}: train.max_minutes={args.max_minutes:g} reached",
                              file=sys.stderr)
                if not (args.eval_every and self.step % args.eval_every == 0):
                    with self.averaged():
                        self._evaluated(self.evaluate(), bar)
                break
        bar.close()
        if self._ema and (self.step >= args.max_steps or self.stopped_by):  # the run is over: end with the average
            torch._foreach_copy_(self._ema_params, self._ema)
        if self.skips and self.is_main:
            print(f"skipped {self.skips} steps with a non-finite loss or gradient (train.nan_policy=skip)",
                  file=sys.stderr)
        return self.last_eval


    def full_model(self):
        """The trained model whole, on rank 0 (None on the others under FSDP): what a run saves for
        `attnlab.load`. Every rank must call it (FSDP gathers the shards)."""
        return parallel.full_model(self.model, self.rank)

    def _evaluated(self, metrics: dict[str, float], bar) -> bool:
        """Log an evaluation and keep the best model; True when early stopping says stop."""
        if not metrics:
            return False
        self._log({"step": self.step, **{k: round(v, 6) for k, v in metrics.items()}})
        args = self.args
        if args.best_metric:
            key = f"eval_{args.best_metric}"
            if key not in metrics:
                raise ValueError(f"train.best_metric={args.best_metric!r}: the evaluation gives "
                                 f"{', '.join(k[5:] for k in metrics)}")
            old = self.best.get(key)
            if old is None or (metrics[key] > old if args.greater_is_better else metrics[key] < old):
                self.best, self.evals_since_best = {"step": self.step, **metrics}, 0
                model = self.full_model()  # a collective under FSDP
                if self.is_main and self.on_best is not None:
                    self.on_best(model, self.best)
                elif self.is_main:
                    keep_best(lambda: save_model(model, self.output / "best"), self.output / "best", self.step)
            else:
                self.evals_since_best += 1
            bar.set_postfix(**{args.best_metric: f"{metrics[key]:.4f}", "best": f"{self.best[key]:.4f}"})
        if self.is_main:  # (under torchrun every process evaluates; one says so)
            bar.write(f"step {self.step}: " + ", ".join(f"{k}={v:.4f}" for k, v in metrics.items()),
                      file=sys.stderr)  # stdout is for a command's result (finetune prints its JSON summary there)
        return args.patience > 0 and self.evals_since_best >= args.patience


def _logged_by(line: str, step: int) -> bool:
    """A metrics.jsonl line written at or before `step` (a line torn by a kill is dropped)."""
    try:
        return json.loads(line)["step"] <= step
    except (ValueError, KeyError, TypeError):
        return False


def _count_tokens(batch: dict) -> int:
    if "attention_mask" in batch:
        return int(batch["attention_mask"].sum())
    ids = batch.get("input_ids")
    return int(ids.numel()) if ids is not None else 0
