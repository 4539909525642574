"""Fine-tune a pretrained encoder on a task, evaluate it, predict with it.

What a run is told is one record, `FinetuneOptions` (tasks/finetune_options.py); `FinetuneRun` carries it out in
named stages a reader can follow, each a method that reads and sets the run's attributes:

    split -> teacher -> schedule -> build_model -> features -> train -> evaluate -> save

(the teacher stage comes before the schedule: its copies, or the full-file recipe, change what gets planned).
The loop is the shared `attnlab.training.Trainer` (AdamW without decay on biases and norms, linear warmup +
decay, gradient clipping, the non-finite-loss stop); this module brings what is task-specific: the task's
features, length-bucketed batches reshuffled each epoch, evaluation by the task's own metric, the best
checkpoint kept in the output directory and early stopping. Speed on CPU comes from length-bucketed batches
(little padding) and, by default, a frozen word-embedding matrix: it is half of MiniLM's parameters, and its
dense gradient and AdamW update cost more than they bring when fine-tuning.
"""
from __future__ import annotations

import json
import math
import random
import time
import warnings
from pathlib import Path

import torch

from .base import Task, get_task, labels_of
from .common import EpochBatches, collate, length_batches
from .defaults import (COMPILE_PAD, DEFAULT_HOLDOUT, FULL_TEACHER_EMA, FULL_TEACHER_FREEZE_EMBEDDINGS, FULL_TEACHER_KD,
                       FULL_TEACHER_STUDENT_EPOCHS, FULL_TEACHER_T, SMALL_BATCH, STUDENT_EPOCHS, TEACHER_KD, TEACHER_T,
                       default_schedule, default_setfit_steps, holdout_size)
from .finetune_eval import (evaluate, evaluate_examples, head_class, load_for_eval, load_for_task,  # noqa: F401
                            predict)
from .finetune_options import FinetuneOptions
from .finetune_stages import _say, distillation_student, setfit_stage, summarize
from .finetune_teachers import full_file, full_file_teacher, self_training_spans
from .splits import read_many, read_splits, report_file

# evaluate and predict live in finetune_eval.py; they are this module's too, as they always were
__all__ = ["FinetuneOptions", "FinetuneRun", "evaluate", "finetune", "predict"]

# Self-distillation's temperature: DistilBERT's 2 (Sanh et al. 2019), the one measured (research/fewlabel/RESULTS.md)
SELF_DISTILL_T = 2.0
_load_for_eval = load_for_eval  # the name scripts patch


def _seed_all(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def finetune(task: str | Task, model: str | Path, output: str | Path, options: FinetuneOptions | None = None,
             **overrides) -> dict:
    """Fine-tune `model` on `task`; the best checkpoint (by the task's main metric on the validation data) is
    written to `output` with its tokenizer, plus metrics.jsonl (the run), metrics.json (the summary, returned)
    and options.json (what the run was told). `options` is a FinetuneOptions (each field says what it does);
    `overrides` are its fields by name, e.g. finetune("sst2", "minilm", "runs/sst2", epochs=1, lr=3e-5); an
    unknown name is a TypeError naming it. The split and the schedule are printed to stderr.

    Recipes beyond a plain fine-tune, chosen by the fields: SetFit (setfit_steps; the few-label rule turns it on
    below SETFIT_BELOW examples), self-training (self_train) and self-distillation (self_distill), which first run
    this very fine-tune into output/teacher; an LM teacher (teacher), which labels augmented copies of a few
    labels, or, on TEACHER_BELOW examples or more, gives every example of the file its logits (the full-file
    recipe, tasks/defaults.py FULL_TEACHER_*, its logits cached in output/teacher); task distillation
    (student_layers: `model` is a fine-tuned teacher); LoRA (lora)."""
    if options is not None and not isinstance(options, FinetuneOptions):
        raise TypeError(f"finetune: options must be a FinetuneOptions, not {type(options).__name__}")
    options = (options or FinetuneOptions()).replace(**overrides)
    return FinetuneRun(task, model, output, options).run()


class FinetuneRun:
    """One fine-tuning run: `run()` calls the stages in order; each stage may also be called on its own once the
    ones before it ran (a test, or a script that stops after `split` to look at the data)."""
    self_distill_t = SELF_DISTILL_T

    def __init__(self, task: str | Task, model: str | Path, output: str | Path,
                 options: FinetuneOptions | None = None) -> None:
        self.task = task = get_task(task) if isinstance(task, str) else task
        self.model, self.output = model, Path(output)
        self.options = o = options or FinetuneOptions()
        pooled = head_class(task).__name__ == "SequenceClassification"
        if o.pooling is not None and not pooled:
            raise ValueError(f"finetune {task.name}: pooling applies to sentence classification; "
                             f"{task.name} trains a {task.architecture}")
        if o.head_init == "probe" and (not pooled or getattr(task, "regression", False)
                                       or o.student_layers is not None):
            raise ValueError(f"finetune {task.name}: a linear-probe head (head_init='probe') needs a sentence "
                             "classification task without distillation")
        hp = {**dict(epochs=3, lr=5e-5, batch_size=32, max_length=128), **task.hyper}
        self.epochs_given, self.batch_given, self.lr_given = (o.epochs is not None, o.batch_size is not None,
                                                              o.lr is not None)
        # what the stages resolve: the options as given stay in self.options
        self.epochs = hp["epochs"] if o.epochs is None else o.epochs
        self.lr = hp["lr"] if o.lr is None else o.lr
        self.batch_size = hp["batch_size"] if o.batch_size is None else o.batch_size
        self.max_length = hp["max_length"] if o.max_length is None else o.max_length
        self.setfit_steps, self.setfit_pairs, self.pooling = o.setfit_steps, o.setfit_pairs, o.pooling
        self.head_init, self.precision, self.self_train = o.head_init, o.precision, o.self_train or 0
        self.freeze_embeddings, self.ema = o.freeze_embeddings, o.ema
        self.test_ex = None
        report = report_file(task, o.train_file, o.valid_file, o.test_file) if o.splits is None else None
        if report is not None:  # validation is held out of the training file; the dev file only reports
            self.options = o = o.replace(test_file=report)
            _say(f"finetune {task.name}: {report} is the report set: scored once on the kept model, never used "
                 "to choose it (validation is held out of the training file)")
        if o.test_file is not None:  # read (and so checked) before any training, not after it
            for part in str(o.test_file).split(","):
                if not Path(part).is_file():
                    raise FileNotFoundError(f"finetune {task.name}: test file {part} does not exist")
            self.test_ex = read_many(task, o.test_file)
        self.output.mkdir(parents=True, exist_ok=True)
        self.started = time.time()
        _seed_all(o.seed)

    def run(self) -> dict:
        self.split()
        self.teacher()
        self.schedule()
        self.build_model()
        self.features()
        self.train()
        self.evaluate()
        return self.save()

    # --- split: which examples train and which validate ---
    def split(self) -> None:
        """Read the data and hold out the validation part (read_splits), deciding the few-label rule on the file's
        size first: below SETFIT_BELOW examples SetFit's own recipe, with nothing held out."""
        from ..interop.local import sentence_pooling
        o, task = self.options, self.task
        self.setfit_ok = (head_class(task).__name__ == "SequenceClassification"
                          and not getattr(task, "regression", False) and len(getattr(task, "columns", (0,))) == 1
                          and o.student_layers is None and not o.lora and not o.from_scratch)
        # The few-label rule: below SETFIT_BELOW examples, SetFit's own recipe (contrastive stage + probe-fitted
        # head, no fine-tuning after) on a sentence-transformers checkpoint: nothing is selected on validation,
        # so nothing is held out and every labeled example trains.
        self.st_pooling = sentence_pooling(self.model)  # SetFit's ground, the pooling the checkpoint was trained for
        eligible = (self.setfit_ok and self.st_pooling is not None and o.setfit_steps is None and not self.epochs_given
                    and o.valid_file is None and o.holdout is None and not o.resume and not o.self_train
                    and not o.self_distill and str(o.teacher).lower() in ("none", ""))
        rule = [0, ""]  # (SetFit steps, why), decided on the file's size before anything is held out

        def rule_holdout(n_file: int) -> int | None:
            rule[:] = default_setfit_steps(min(n_file, o.max_train_samples or n_file), eligible)
            if not rule[0]:
                return o.holdout
            # Nothing held out only when holding out would cost labeled examples: a subset of a larger file
            # (max_train_samples, as `attnlab curve` draws) still leaves the usual validation part to score on.
            # (The rule is only eligible when no hold-out was given, so the usual part is read_splits' default.)
            spare = n_file - holdout_size(n_file, DEFAULT_HOLDOUT)
            return None if o.max_train_samples and spare >= o.max_train_samples else 0

        self.train_path, self.train_ex, self.valid_ex, self.valid_desc, self.valid_note = o.splits or read_splits(
            task, o.train_file, o.valid_file, rule_holdout, o.max_train_samples, o.max_eval_samples, o.seed,
            carve=True)
        rule_steps, self.setfit_why = rule
        self.setfit_rule = rule_steps > 0
        if self.setfit_rule:
            self.setfit_steps, self.setfit_pairs, self.epochs = rule_steps, "all", 0
            self.setfit_why += " (the default rule)"
            if not self.valid_ex:
                self.valid_note = ("SetFit's head-only recipe selects no checkpoint, so every labeled example "
                                   "trains; give --valid to score the model")
        self.n_labeled = len(self.train_ex)

    # --- teacher: what the kept model learns from besides the labels ---
    def teacher(self) -> None:
        """Self-training / self-distillation's first run (a plain fine-tune into output/teacher) and its spans;
        then the LM teacher, if any: copies of a few labels, or the full-file recipe."""
        from ..training.trainer import distributed_context
        o, task = self.options, self.task
        self.teacher_dir, self.teacher_summary, self.self_info = self.output / "teacher", {}, {}
        if (self.self_train or o.self_distill) and not (self.setfit_ok and distributed_context()[1] == 1
                                                         and o.setfit_steps is None and not o.save_every
                                                         and not o.resume):
            raise ValueError(f"finetune {task.name}: self-training (self_train) and self-distillation (self_distill) "
                             "need pretrained weights, a single-sentence classification task, one process, and no "
                             "LoRA, distillation, SetFit stage or training checkpoints (--save-every/--resume: it "
                             "is two runs)")
        if self.self_train or o.self_distill:
            # the teacher: this very run without either, on the same split, scored on no test file
            why = " and ".join(x for x in (self.self_train and f"--self-train {self.self_train}",
                                           o.self_distill and f"--self-distill {o.self_distill:g}") if x)
            _say(f"finetune {task.name}: {why}: first the teacher, a plain fine-tune of the {len(self.train_ex)} "
                 f"labeled examples, into {self.teacher_dir}")
            first = o.replace(self_train=0, self_distill=0.0, test_file=None, splits=(
                self.train_path, self.train_ex, self.valid_ex, self.valid_desc, self.valid_note))
            self.teacher_summary = FinetuneRun(task, self.model, self.teacher_dir, first).run()
        if self.self_train:
            spans, self.self_info = self_training_spans(task, self.self_train, f"--self-train {self.self_train}",
                                                        self.teacher_dir, self.teacher_summary, self.train_ex,
                                                        self.max_length, o.seed)
            self.train_ex = self.train_ex + spans
        self._lm_teacher(distributed_context()[1])

    def _lm_teacher(self, world: int) -> None:
        from .prompt_teacher import choose_teacher
        o, task = self.options, self.task
        self.lm_teacher, why = choose_teacher(task, o.teacher, len(self.train_ex), self.setfit_ok and not (
            self.self_train or o.self_distill or o.save_every or o.resume or self.setfit_rule
            or o.setfit_steps is not None or world > 1),
            self.st_pooling is not None and not (self.epochs_given or self.lr_given or self.batch_given))
        self.teacher_info, self.soft, self.full_file = {}, None, False
        self.kd, self.temperature = TEACHER_KD, TEACHER_T
        if not self.lm_teacher:
            return
        if full_file(len(self.train_ex)):  # every example gets the teacher's logits; no copies
            self.full_file = True
            self.soft, self.teacher_info = full_file_teacher(
                task, self.train_ex, len(self.valid_ex), teacher=self.lm_teacher, why=why,
                cache_dir=self.output / "teacher", seed=o.seed, progress=o.progress)
            self.kd, self.temperature = FULL_TEACHER_KD, FULL_TEACHER_T
            self.epochs = self.epochs if self.epochs_given else FULL_TEACHER_STUDENT_EPOCHS
            self.ema = FULL_TEACHER_EMA if self.ema is None else self.ema
            self.freeze_embeddings = (FULL_TEACHER_FREEZE_EMBEDDINGS if self.freeze_embeddings is None
                                      else self.freeze_embeddings)
            return
        from .prompt_teacher import teacher_examples
        _say(f"finetune {task.name}: {len(self.train_ex)} labeled examples train, {len(self.valid_ex)} validate; "
             f"first an LM teacher, because {why}")
        copies, self.soft, self.teacher_info = teacher_examples(
            task, self.train_ex, task.label_list(self.train_ex), teacher=self.lm_teacher,
            output=self.output / "teacher", seed=o.seed, progress=o.progress)
        self.train_ex, self.teacher_info["why"] = self.train_ex + copies, why
        self.epochs = self.epochs if self.epochs_given else STUDENT_EPOCHS
        self.batch_size = self.batch_size if self.batch_given else SMALL_BATCH

    # --- schedule: epochs, batch size, lr, SetFit, pooling ---
    def schedule(self) -> None:
        """The schedule for the data (defaults.default_schedule), the SetFit stage and the pooling, and what is
        left at its default (frozen embeddings, no weight average)."""
        o, task = self.options, self.task
        # auto (bf16 where it trains faster, nn/precision): on validation carved from the training data bf16 lost
        # nothing beyond noise for few labels (the SetFit stage) nor for a pretrained sentence (pair) classifier or
        # regressor (research/quality/CHOICES.md); tokens, spans, random weights, LoRA and a distilled student
        # were not measured: fp32
        sentence = (head_class(task).__name__ == "SequenceClassification"
                    and not (o.from_scratch or o.lora or o.student_layers is not None))
        self.precision = self.precision or ("auto" if self.lm_teacher or self.setfit_rule or sentence else "fp32")
        self.epochs, self.batch_size, self.lr = default_schedule(
            len(self.train_ex), self.epochs, self.batch_size, self.lr,
            epochs_given=self.epochs_given or self.setfit_rule or bool(self.lm_teacher),
            batch_given=self.batch_given or bool(self.lm_teacher), lr_given=self.lr_given)
        if self.setfit_steps is None:
            self.setfit_steps = 0
        elif not self.setfit_rule:
            self.setfit_why = "--setfit-steps"
            if self.setfit_steps and not self.setfit_ok:
                raise ValueError(f"finetune {task.name}: SetFit (setfit_steps) needs pretrained weights, a single-"
                                 "sentence classification task, and no LoRA or distillation")
        if self.epochs == 0 and not self.setfit_steps:
            raise ValueError("finetune: epochs=0 (no fine-tuning) only follows a SetFit stage (setfit_steps > 0)")
        if self.setfit_steps:  # SetFit's head reads the mean-pooled vectors its pairs were trained on
            self.pooling = self.pooling or "mean"
            self.head_init = self.head_init or "probe"
        elif self.pooling is None and self.st_pooling and head_class(task).__name__ == "SequenceClassification":
            self.pooling = self.st_pooling  # read the sentence vector the checkpoint was trained to give (1_Pooling)
        self.freeze_embeddings = True if self.freeze_embeddings is None else self.freeze_embeddings
        self.ema = self.ema or 0.0
        n, extra = self.n_labeled, len(self.train_ex) - self.n_labeled
        spanned = (f" ({n} labeled + {extra} spans the teacher labeled)" if self.self_train else
                   f" ({n} labeled, each with the teacher's logits)" if self.full_file else
                   f" ({n} labeled + {extra} augmented copies the teacher labeled)" if self.lm_teacher else "")
        _say(f"finetune {task.name}: train {len(self.train_ex)} examples{spanned}, validate {len(self.valid_ex)} "
             f"({self.valid_note})")

    # --- build_model: the network the Trainer optimises ---
    def build_model(self) -> None:
        """The model with the task's head (fresh weights with from_scratch), wrapped for task distillation or
        self-distillation, or given LoRA adapters."""
        from ..interop import load_tokenizer
        o, task = self.options, self.task
        self.labels = task.label_list(self.train_ex)
        self.tokenizer = load_tokenizer(self.model)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*(newly initialised|unused tensors).*")  # a fresh head
            net = load_for_task(task, self.model, task.model_extra(self.labels), self.pooling)
        self.distill_teacher, self.loss_fn, self.soft_teacher = None, None, None  # loss None: model(**batch).loss
        if o.from_scratch:
            net.init_weights()
            net.tie_weights()
        trained = net  # what the Trainer optimises: the model, or a Distillation (student + projections)
        if o.student_layers is None and (o.student_width or o.student_heads):
            raise ValueError(f"finetune {task.name}: a student width or head count needs distillation "
                             "(student_layers)")
        if o.student_layers is not None:
            self.distill_teacher = net
            net, trained = distillation_student(net, o, self.task.name)
        if o.self_distill:  # the fresh copy learns from the labels and the teacher run's soft targets
            from ..objectives.distill import DistillConfig, Distillation
            self.soft_teacher = _load_for_eval(task, self.teacher_dir)[0]
            t_labels, s_labels = labels_of(self.soft_teacher)[0], labels_of(net)[0]
            if t_labels != s_labels:  # soft targets are read class by class
                raise ValueError(f"finetune {task.name}: the teacher in {self.teacher_dir} has classes {t_labels}, "
                                 f"the student {s_labels}")
            trained = Distillation(net, self.soft_teacher, DistillConfig(
                temperature=SELF_DISTILL_T, alpha_ce=o.self_distill, alpha_task=1 - o.self_distill, alpha_cos=0.0))
            _say(f"finetune {task.name}: the kept model is a fresh copy of {self.model} trained on "
                 f"{1 - o.self_distill:g} x the labels' loss + {o.self_distill:g} x the teacher's soft targets "
                 f"(T = {SELF_DISTILL_T:g})")
        if trained is not net:  # a Distillation returns (loss, parts)
            self.loss_fn = lambda model, batch: model(batch)[0]  # noqa: E731
        if o.lora:
            from ..interop.peft import lora_for_training
            trainable = lora_for_training(net, **o.lora)
            _say(f"finetune {task.name}: LoRA {o.lora}, {trainable:,} trainable parameters of "
                 f"{net.num_parameters():,}")
        self.net, self.trained = net, trained

    # --- features: the training examples as model inputs; the stages before fine-tuning ---
    def features(self) -> None:
        """The training features (with the LM teacher's logits), the frozen embeddings, the SetFit stage and the
        probe-fitted head."""
        from ..training.checkpoint import list_checkpoints
        o, task, net = self.options, self.task, self.net
        _, label2id = labels_of(net)
        self.feats = feats = task.features(self.train_ex, self.tokenizer, self.max_length, label2id, training=True)
        if self.soft is not None:  # the teacher's logits ride in the batches, columns in the student's class order
            from .prompt_teacher import soft_label_loss
            # the soft columns follow `labels` (the copies carry only labels the sentences have)
            columns = [self.labels.index(label) for label in labels_of(net)[0]]
            for f in feats:
                f["soft_labels"] = self.soft[f["example"], columns].tolist()
            self.loss_fn = soft_label_loss(self.kd, self.temperature)
            _say(f"finetune {task.name}: the student learns from {1 - self.kd:g} x the labels' loss + {self.kd:g} x "
                 f"the teacher's soft targets (T = {self.temperature:g})")
        if self.freeze_embeddings:
            net.backbone.embeddings.tok.weight.requires_grad_(False)
        if self.setfit_steps and not (o.resume and list_checkpoints(self.output)):  # a resumed run's checkpoint
            setfit_stage(task.name, net, feats, self.tokenizer.pad_token_id, self.setfit_steps,  # holds its result
                         self.setfit_pairs, self.setfit_why, o.seed, self.precision)
        # the default is BERT's fresh head: the probe start measured no better (research/fewlabel/RESULTS.md)
        self.head_init = self.head_init or "random"
        if self.head_init == "probe":
            from .probe import probe_init
            t0 = time.time()
            fit = probe_init(net, feats, self.tokenizer.pad_token_id)
            _say(f"finetune {task.name}: head warm-started from a linear probe on the frozen sentence vectors "
                 f"({fit:.1f}% on the training examples, {time.time() - t0:.0f} s)")

    # --- train: the Trainer's loop, the best checkpoint kept in the output ---
    def train(self) -> None:
        from ..interop.native import save_model
        from ..training import TrainArgs, Trainer
        from ..training.checkpoint import keep_best
        from ..training.trainer import distributed_context
        o, task, net, output = self.options, self.task, self.net, self.output
        feats, pad_id = self.feats, self.tokenizer.pad_token_id
        lengths = [len(f["input_ids"]) for f in feats]
        self.rank, world, _ = distributed_context()
        # under torchrun every process takes its share of each batch (the global batch is batch_size); a batch
        # that does not divide evenly weighs each process's mean equally, a batch smaller than the number of
        # processes gives the short ones its last example again
        rank, batch_size, seed = self.rank, self.batch_size, o.seed
        # a compiled step, and any training on a CPU, see batches padded to a multiple of COMPILE_PAD tokens, so a
        # few shapes. The compiler compiles each shape; on a CPU a width per batch length kept giving oneDNN and
        # the heap (nn/precision.tune_malloc) new sizes: bf16 fine-tuning on SQuAD (padded layout, models/encoder.py)
        # grew a process by ~1 GB every 100 steps (8.8 GB at step 550), at multiples of 32 flat (~3.7 GB); fp32
        # (unpadded) grew from 4.0 to 7.0 GB in 150 steps, 4.4-4.8 GB with the widths and row counts rounded
        multiple = COMPILE_PAD if o.compile or not torch.cuda.is_available() else 1  # (the Trainer takes CUDA if any)
        data = EpochBatches(lambda epoch: length_batches(lengths, batch_size, shuffle=True, seed=seed + epoch),
                            lambda idx: collate([feats[i] for i in (idx[rank::world] or idx[-1:])], pad_id, multiple))
        steps_per_epoch = len(data)
        self.total = total = max(1, math.ceil(steps_per_epoch * self.epochs)) if self.epochs else 0
        pooled = type(net).__name__ == "SequenceClassification"
        _say(f"finetune {task.name}: {total} steps = {self.epochs:g} epochs of {steps_per_epoch} batches of "
             f"{batch_size}, lr {self.lr:g}" + (f" (x{o.layer_decay:g} a layer down)" if o.layer_decay != 1.0 else "")
             + (f", weights averaged (EMA {self.ema:g})" if self.ema else "")
             + (f", {net.config.classifier_pooling} pooling" if pooled else ""))
        if not o.resume:
            (output / "metrics.jsonl").write_text("")  # this run's log (the Trainer appends)
        args = TrainArgs(output_dir=str(output), max_steps=max(1, total), lr=self.lr,
                         warmup_steps=int(total * o.warmup_ratio), schedule="linear", weight_decay=o.weight_decay,
                         layer_decay=o.layer_decay, ema=self.ema, eps=1e-8, clip_norm=1.0, seed=seed,
                         eval_every=o.eval_every or steps_per_epoch, log_every=o.log_every, save_every=o.save_every,
                         keep_last=2 if o.save_every else 0, resume=o.resume, parallel=o.parallel,
                         progress=o.progress, best_metric=task.main_metric, patience=o.patience or 0,
                         compile=o.compile, precision=self.precision, max_minutes=o.max_minutes or 0.0)
        base_name, tokenizer = str(self.model), self.tokenizer

        def save_best(model) -> None:  # the best checkpoint is the one kept, in the output itself
            if o.lora:  # the adapter alone, and the merged model that evaluate/predict load like any other
                from ..interop.peft import merged_copy, save_adapter
                save_adapter(model, output / "adapter", base_model_name_or_path=base_name)
                model = merged_copy(model)
            save_model(model, output)
            tokenizer.save(output)

        def on_best(model, record: dict) -> None:  # a full disk: one line, the model kept before stays whole
            keep_best(lambda: save_best(model), output, record["step"])

        student_of = lambda model: getattr(model, "student", model)  # noqa: E731  (a Distillation holds it)
        valid_ex, max_length = self.valid_ex, self.max_length
        self.trainer = trainer = Trainer(
            self.trained, args, data, loss_fn=self.loss_fn,
            evaluate_fn=lambda model: evaluate_examples(task, student_of(model), tokenizer, valid_ex, max_length)[0],
            on_best=lambda model, record: on_best(student_of(model), record))
        for frozen in (self.distill_teacher, self.soft_teacher):
            if frozen is not None:
                frozen.to(trainer.device)
        if total:
            trainer.train()
            self.step, self.best = trainer.step, trainer.best
        else:  # SetFit's probe-fitted head with no fine-tuning after: score it (when there is validation data)
            self.step, self.best = 0, {"step": 0, **(trainer.evaluate() if valid_ex else {})}
            on_best(net, self.best)
        self.stopped_by = trainer.stopped_by if total else ""
        self.trained_at = time.time()

    # --- evaluate: the kept model on the test file ---
    def evaluate(self) -> None:
        """The kept model scored on options.test_file (summary test_*), by the first process only."""
        o, self.tested = self.options, {}
        if o.test_file is None or self.rank != 0:
            return
        scores = evaluate(self.task, self.output, self.test_ex, max_length=self.max_length)
        tested = {f"test_{k}": v for k, v in scores.items() if k not in ("task", "examples")}
        self.tested = {"test": str(o.test_file), "test_examples": scores["examples"], **tested}
        _say(f"finetune {self.task.name}: the kept model (step {self.best.get('step')}) on {o.test_file}: "
             + ", ".join(f"{k}={v}" for k, v in tested.items()))

    # --- save: the summary (metrics.json) and the options beside the model ---
    def save(self) -> dict:
        """Under torchrun only the first process writes (the others have no test scores to add)."""
        from ..interop.files import atomic_write
        summary = self.summary()
        if self.rank != 0:
            return summary
        atomic_write(self.output / "options.json", lambda tmp: Path(tmp).write_text(
            json.dumps(self.options.to_dict(), indent=2, default=str) + "\n"))
        atomic_write(self.output / "metrics.json",
                     lambda tmp: Path(tmp).write_text(json.dumps(summary, indent=2) + "\n"))
        return summary

    def summary(self) -> dict:
        """metrics.json: what ran (the resolved options), how long, and the kept model's scores."""
        return summarize(self)
