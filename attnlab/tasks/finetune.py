"""Fine-tune a pretrained encoder on a task, evaluate it, predict with it.

The loop is the shared `attnlab.training.Trainer` (AdamW without decay on biases and norms, linear
warmup + decay, gradient clipping, the non-finite-loss stop); this module brings what is task-specific:
the task's features, length-bucketed batches reshuffled each epoch, evaluation by the task's own metric
(`evaluate_fn`), the best checkpoint kept in the output directory (`on_best`) and early stopping
(`patience`). Speed on CPU comes from length-bucketed batches (little padding) and, by default, a frozen
word-embedding matrix: it is half of MiniLM's parameters, and its dense gradient and AdamW update cost
more than they bring when fine-tuning.
"""
from __future__ import annotations

import json
import math
import random
import sys
import time
import warnings
from pathlib import Path

import torch

from ..config import CLASSIFIER_POOLINGS
from .base import Task, get_task, labels_of
from .common import DataError, EpochBatches, collate, length_batches
from .defaults import (COMPILE_PAD, DEFAULT_HOLDOUT, SMALL_BATCH, STUDENT_EPOCHS, TEACHER_KD, TEACHER_T, default_schedule,
                       default_setfit_steps, holdout_size)
from .splits import read_many, read_splits

# Self-distillation's temperature: DistilBERT's 2 (Sanh et al. 2019), the one measured (research/fewlabel/RESULTS.md)
SELF_DISTILL_T = 2.0


def _seed_all(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def evaluate_examples(task: Task, model, tokenizer, examples: list[dict], max_length: int,
                      batch_size: int = 64, progress: bool = False) -> tuple[dict, list]:
    predictions = task.predict(model, tokenizer, examples, max_length, batch_size, progress)
    return task.score(examples, predictions), predictions


def finetune(task: str | Task, model: str | Path, output: str | Path, *, train_file=None, valid_file=None,
             epochs: float | None = None, lr: float | None = None, batch_size: int | None = None,
             max_length: int | None = None, seed: int = 42, warmup_ratio: float = 0.1,
             weight_decay: float = 0.01, eval_every: int | None = None, patience: int | None = None,
             max_train_samples: int | None = None, max_eval_samples: int | None = None,
             holdout: int | None = None, freeze_embeddings: bool = True, progress: bool = True,
             log_every: int = 50, from_scratch: bool = False, student_layers: int | None = None,
             distill=None, student_width: int | None = None, student_heads: int | None = None,
             save_every: int = 0, resume: bool = False, parallel: str = "ddp",
             lora: dict | None = None, pooling: str | None = None, head_init: str | None = None,
             setfit_steps: int | None = None, setfit_pairs: str = "all", compile: bool = False,
             precision: str | None = None, max_minutes: float | None = None, layer_decay: float = 1.0,
             ema: float = 0.0, test_file: str | Path | None = None, self_train: int | None = None,
             self_distill: float = 0.0, splits: tuple | None = None, teacher: str | None = None) -> dict:
    """Fine-tune `model` on `task`; the best checkpoint (by the task's main metric on the validation
    data) is written to `output` with its tokenizer, plus metrics.jsonl (the run) and metrics.json
    (the summary, returned). Data and held-out split: `read_splits`. Unset epochs / batch size follow
    `default_schedule` (more steps for small data). The split and the schedule are printed to stderr.

    pooling: what a sequence classifier reads, "cls" (the pooled [CLS] vector, BERT §4.1) or "mean" (the
    masked mean of the last hidden states); None keeps the checkpoint's ("cls" for a Hugging Face BERT).
    head_init: "probe" fits a logistic regression on the frozen sentence vectors and starts the classifier
    from it (LP-FT, Kumar et al. 2022); "random" (the default) is BERT's fresh head.
    compile: torch.compile the training step (train.compile of the Trainer); batches are padded to multiples
    of COMPILE_PAD tokens so that only a few shapes get compiled.
    precision: "bf16" runs forward and backward under bf16 autocast (train.precision of the Trainer; weights,
    gradients and AdamW stay fp32); fast only where the CPU has AVX512-BF16/AMX (a warning otherwise). "auto" is
    bf16 where the hardware has it, else fp32; the summary's "precision" says which ran. None: "auto" for the
    student of an LM teacher (as fast, and as accurate, measured), else "fp32".
    max_minutes: a time budget (train.max_minutes of the Trainer): training stops after it, evaluates, and the best
    model so far is what `output` holds; the summary says stopped_by_time. The schedule stays planned for `epochs`.
    layer_decay: < 1 gives each layer below the top that factor of the learning rate of the one above it, the
    embeddings the lowest (train.layer_decay; training/optim.py).
    ema: > 0 evaluates (and so keeps) an exponential moving average of the weights of that decay
    (train.ema of the Trainer) instead of the weights as trained.
    self_train: spans drawn from each training sentence for self-training (tasks/selftrain.py): a first fine-tune
    (the teacher, kept in `output`/teacher) labels them, the confident ones join the training examples, and the
    model kept in `output` is a fresh copy trained on both, validated on the same examples. None or 0: off (no
    default turns it on: at 1,000 SST-2 sentences it measured no gain, research/fewlabel/RESULTS.md).
    self_distill: in (0, 1), self-distillation (born-again networks, Furlanello et al. 2018): after the same
    teacher run, the kept model is a fresh copy of `model` trained on (1 - self_distill) x the labels' loss +
    self_distill x the teacher's soft targets (T = SELF_DISTILL_T, objectives/distill.py). 0: off.
    teacher: a causal LM (e.g. "smollm2") fine-tuned as a prompt classifier on the training examples
    (tasks/prompt_teacher.py), which labels augmented copies of them and gives every example soft targets the model
    learns from (one epoch in batches of 16 unless given). None or "none": no teacher (where one was measured to
    help, the run says so: defaults.teacher_helps).
    splits: (train path, train examples, validation examples, their description, note) already read and split
    (the self-training teacher's run reuses its caller's); the files are then not read.
    test_file: a labelled file the kept model is scored on after training (summary "test_*"): the checkpoint is
    chosen on the validation data and reported on data that played no part in choosing it.
    setfit_pairs: "sampled" (SetFit's sampler) or "all" (every pair within a batch of sentences).
    setfit_steps: steps of SetFit's contrastive pairs on the encoder before the head (tasks/setfit.py, Tunstall
    et al. 2022); the head then reads mean pooling and starts from a probe, unless given. None follows
    `default_setfit_steps`, 0 is off. epochs=0 (with SetFit only): no fine-tuning after, SetFit's own recipe.
    from_scratch: same architecture and tokenizer, random weights (the baseline a pretrained model must beat).
    student_layers: task distillation (Sanh et al. 2019, §3 applied to a task): `model` is a model already
    fine-tuned on `task`, the teacher; a student of `student_layers` layers starts from every other teacher
    layer (and the teacher's head) and learns from the teacher's soft targets at temperature T, the labels
    and the teacher's last hidden states (`distill`, a DistillConfig, which may add TinyBERT's / MiniLM's
    layer terms). `student_width` (and `student_heads`) make the student narrower: its embeddings, pooler and
    classifier start from the teacher's through a PCA basis, its layers from random (init_narrow_student).

    save_every: also write a training checkpoint (weights, AdamW, schedule, RNG, data position, best so
    far) to `output`/checkpoints every N steps, so that `resume=True` continues a killed run exactly.
    parallel: "ddp" or "fsdp" under torchrun (each process takes its share of every batch).
    lora: LoRA instead of full fine-tuning (Hu et al. 2021), e.g. dict(r=8, alpha=16): only the adapters and
    the task head train; the best adapter goes to output/adapter (PEFT layout), the merged model to output."""
    options = dict(locals())  # every argument as the caller gave it: the self-training teacher runs with the same
    from ..interop import load_tokenizer
    from ..interop.files import atomic_write
    from ..training import TrainArgs, Trainer
    from ..training.checkpoint import keep_best
    from ..interop.native import save_model

    task = get_task(task) if isinstance(task, str) else task
    if pooling is not None and pooling not in CLASSIFIER_POOLINGS:
        raise ValueError(f"finetune: pooling={pooling!r} is not one of {', '.join(CLASSIFIER_POOLINGS)}")
    if pooling is not None and head_class(task).__name__ != "SequenceClassification":
        raise ValueError(f"finetune {task.name}: pooling applies to sentence classification; "
                         f"{task.name} trains a {task.architecture}")
    if head_init not in (None, "probe", "random"):
        raise ValueError(f"finetune: head_init={head_init!r} is not one of probe, random")
    if head_init == "probe" and (head_class(task).__name__ != "SequenceClassification"
                                 or getattr(task, "regression", False) or student_layers is not None):
        raise ValueError(f"finetune {task.name}: a linear-probe head (head_init='probe') needs a sentence "
                         "classification task without distillation")
    if setfit_steps is not None and setfit_steps < 0:
        raise ValueError(f"finetune: setfit_steps={setfit_steps} must be 0 (off) or more")
    if self_train is not None and self_train < 0:
        raise ValueError(f"finetune: self_train={self_train} must be 0 (off) or more spans per sentence")
    if not 0 <= self_distill < 1:
        raise ValueError(f"finetune: self_distill={self_distill} must be in [0, 1) (0: off; the soft targets' weight)")
    hp = {**dict(epochs=3, lr=5e-5, batch_size=32, max_length=128), **task.hyper}
    epochs_given, batch_given, lr_given = epochs is not None, batch_size is not None, lr is not None
    epochs = hp["epochs"] if epochs is None else epochs
    lr = hp["lr"] if lr is None else lr
    batch_size = hp["batch_size"] if batch_size is None else batch_size
    max_length = hp["max_length"] if max_length is None else max_length
    test_ex = None
    if test_file is not None:  # read (and so checked) before any training, not after it
        for part in str(test_file).split(","):
            if not Path(part).is_file():
                raise FileNotFoundError(f"finetune {task.name}: test file {part} does not exist")
        test_ex = read_many(task, test_file)
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    started = time.time()
    _seed_all(seed)

    setfit_ok = (head_class(task).__name__ == "SequenceClassification" and not getattr(task, "regression", False)
                 and len(getattr(task, "columns", (0,))) == 1 and student_layers is None and not lora
                 and not from_scratch)
    # The few-label rule: below SETFIT_BELOW examples, SetFit's own recipe (contrastive stage + probe-fitted
    # head, no fine-tuning after) on a sentence-transformers checkpoint: nothing is selected on validation,
    # so nothing is held out and every labeled example trains.
    from ..interop.local import sentence_pooling
    st_pooling = sentence_pooling(model)  # SetFit's ground, and the pooling the checkpoint was trained for
    eligible = (setfit_ok and st_pooling is not None and setfit_steps is None and not epochs_given
                and valid_file is None and holdout is None and not resume and not self_train and not self_distill
                and str(teacher).lower() in ("none", ""))
    rule = [0, ""]  # (SetFit steps, why), decided on the file's size before anything is held out

    def rule_holdout(n_file: int) -> int | None:
        rule[:] = default_setfit_steps(min(n_file, max_train_samples or n_file), eligible)
        if not rule[0]:
            return holdout
        # Nothing held out only when holding out would cost labeled examples: a subset of a larger file
        # (max_train_samples, as `attnlab curve` draws) still leaves the usual validation part to score on.
        # (The rule is only eligible when no hold-out was given, so the usual part is read_splits' default.)
        spare = n_file - holdout_size(n_file, DEFAULT_HOLDOUT)
        return None if max_train_samples and spare >= max_train_samples else 0

    train_path, train_ex, valid_ex, valid_desc, valid_note = splits or read_splits(
        task, train_file, valid_file, rule_holdout, max_train_samples, max_eval_samples, seed)
    rule_steps, setfit_why = rule
    setfit_rule = rule_steps > 0
    if setfit_rule:
        setfit_steps, setfit_pairs, epochs = rule_steps, "all", 0
        setfit_why += " (the default rule)"
        if not valid_ex:
            valid_note = ("SetFit's head-only recipe selects no checkpoint, so every labeled example trains; "
                          "give --valid to score the model")
    from ..training.trainer import distributed_context
    self_train = self_train or 0
    if (self_train or self_distill) and not (setfit_ok and distributed_context()[1] == 1 and setfit_steps is None
                                             and not save_every and not resume):
        raise ValueError(f"finetune {task.name}: self-training (self_train) and self-distillation (self_distill) "
                         "need pretrained weights, a single-sentence classification task, one process, and no "
                         "LoRA, distillation, SetFit stage or training checkpoints (--save-every/--resume: it is "
                         "two runs)")
    n_labeled, self_info, teacher_dir, teacher_summary = len(train_ex), {}, output / "teacher", {}
    if self_train or self_distill:
        # the teacher: this very run without either, on the same split, scored on no test file
        why = " and ".join(x for x in (self_train and f"--self-train {self_train}",
                                       self_distill and f"--self-distill {self_distill:g}") if x)
        print(f"finetune {task.name}: {why}: first the teacher, a plain fine-tune of the {len(train_ex)} labeled "
              f"examples, into {teacher_dir}", file=sys.stderr, flush=True)
        teacher_summary = finetune(**{**options, "task": task, "output": teacher_dir, "self_train": 0,
                                      "self_distill": 0.0, "test_file": None,
                                      "splits": (train_path, train_ex, valid_ex, valid_desc, valid_note)})
    if self_train:
        spans = _self_training_spans(task, self_train, f"--self-train {self_train}", teacher_dir, teacher_summary,
                                     train_ex, max_length, seed)
        train_ex, self_info = train_ex + spans[0], spans[1]
    from .prompt_teacher import choose_teacher
    lm_teacher, teacher_why = choose_teacher(task, teacher, len(train_ex), setfit_ok and not (
        self_train or self_distill or save_every or resume or setfit_rule or options["setfit_steps"] is not None
        or distributed_context()[1] > 1), st_pooling is not None and not (epochs_given or lr_given or batch_given))
    teacher_info, soft = {}, None
    if lm_teacher:
        from .prompt_teacher import teacher_examples
        print(f"finetune {task.name}: {len(train_ex)} labeled examples train, {len(valid_ex)} validate; first an LM "
              f"teacher, because {teacher_why}", file=sys.stderr, flush=True)
        copies, soft, teacher_info = teacher_examples(task, train_ex, task.label_list(train_ex), teacher=lm_teacher,
                                                      output=output / "teacher", seed=seed, progress=progress)
        train_ex, teacher_info["why"] = train_ex + copies, teacher_why
        epochs, batch_size = (epochs if epochs_given else STUDENT_EPOCHS), (batch_size if batch_given else SMALL_BATCH)
    precision = precision or ("auto" if lm_teacher else "fp32")
    epochs, batch_size, lr = default_schedule(len(train_ex), epochs, batch_size, lr,
                                              epochs_given=epochs_given or setfit_rule or bool(lm_teacher),
                                              batch_given=batch_given or bool(lm_teacher), lr_given=lr_given)
    if setfit_steps is None:
        setfit_steps = 0
    elif not setfit_rule:
        setfit_why = "--setfit-steps"
        if setfit_steps and not setfit_ok:
            raise ValueError(f"finetune {task.name}: SetFit (setfit_steps) needs pretrained weights, a single-"
                             "sentence classification task, and no LoRA or distillation")
    if epochs == 0 and not setfit_steps:
        raise ValueError("finetune: epochs=0 (no fine-tuning) only follows a SetFit stage (setfit_steps > 0)")
    if setfit_steps:  # SetFit's head reads the mean-pooled vectors its pairs were trained on
        pooling = pooling or "mean"
        head_init = head_init or "probe"
    elif pooling is None and st_pooling and head_class(task).__name__ == "SequenceClassification":
        pooling = st_pooling  # read the sentence vector the checkpoint was trained to give (1_Pooling)
    # stderr, so that stdout stays the JSON summary
    spanned = f" ({n_labeled} labeled + {len(train_ex) - n_labeled} spans the teacher labeled)" if self_train else \
        f" ({n_labeled} labeled + {len(train_ex) - n_labeled} augmented copies the teacher labeled)" if lm_teacher else ""
    print(f"finetune {task.name}: train {len(train_ex)} examples{spanned}, validate {len(valid_ex)} ({valid_note})",
          file=sys.stderr, flush=True)
    labels = task.label_list(train_ex)
    tokenizer = load_tokenizer(model)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(newly initialised|unused tensors).*")  # a fresh head
        net = load_for_task(task, model, task.model_extra(labels), pooling)
    teacher, loss_fn = None, None  # None: the Trainer's model(**batch).loss
    if from_scratch:
        net.init_weights()
        net.tie_weights()
    trained = net  # what the Trainer optimises: the model, or a Distillation (student + projections)
    if student_layers is None and (student_width or student_heads):
        raise ValueError(f"finetune {task.name}: a student width or head count needs distillation (student_layers)")
    if student_layers is not None:
        from ..objectives.distill import DistillConfig, Distillation, init_student_from_teacher, student_config
        from ..objectives.layer_distill import init_narrow_student
        teacher = net.eval()
        for p in teacher.parameters():
            p.requires_grad_(False)
        net = type(teacher)(student_config(teacher.config, student_layers, student_width, student_heads))
        basis = None
        if net.config.hidden_size != teacher.config.hidden_size:
            basis, kept = init_narrow_student(net, teacher)
            print(f"finetune {task.name}: a {net.config.hidden_size}-wide student: embeddings, pooler and classifier "
                  f"from the teacher's through the top {net.config.hidden_size} principal directions of its token "
                  f"embeddings ({100 * kept:.1f}% of their variance), layers random", file=sys.stderr, flush=True)
        else:
            init_student_from_teacher(net, teacher)
        trained = Distillation(net, teacher, distill or DistillConfig(), basis)
    soft_teacher = None
    if self_distill:  # the fresh copy learns from the labels and the teacher run's soft targets
        from ..objectives.distill import DistillConfig, Distillation
        soft_teacher = _load_for_eval(task, teacher_dir)[0]
        t_labels, s_labels = labels_of(soft_teacher)[0], labels_of(net)[0]
        if t_labels != s_labels:  # soft targets are read class by class
            raise ValueError(f"finetune {task.name}: the teacher in {teacher_dir} has classes {t_labels}, "
                             f"the student {s_labels}")
        trained = Distillation(net, soft_teacher, DistillConfig(temperature=SELF_DISTILL_T, alpha_ce=self_distill,
                                                                alpha_task=1 - self_distill, alpha_cos=0.0))
        print(f"finetune {task.name}: the kept model is a fresh copy of {model} trained on {1 - self_distill:g} x the "
              f"labels' loss + {self_distill:g} x the teacher's soft targets (T = {SELF_DISTILL_T:g})",
              file=sys.stderr, flush=True)
    if trained is not net:  # a Distillation returns (loss, parts)
        loss_fn = lambda model, batch: model(batch)[0]  # noqa: E731
    if lora:
        from ..interop.peft import lora_for_training
        trainable = lora_for_training(net, **lora)
        print(f"finetune {task.name}: LoRA {lora}, {trainable:,} trainable parameters of {net.num_parameters():,}",
              file=sys.stderr, flush=True)
    _, label2id = labels_of(net)
    feats = task.features(train_ex, tokenizer, max_length, label2id, training=True)
    if soft is not None:  # the teacher's logits ride in the batches, columns in the student's class order
        from .prompt_teacher import soft_label_loss
        # the soft columns follow `labels` (the copies carry only labels the sentences have)
        columns = [labels.index(label) for label in labels_of(net)[0]]
        for f in feats:
            f["soft_labels"] = soft[f["example"], columns].tolist()
        loss_fn = soft_label_loss(TEACHER_KD, TEACHER_T)
        print(f"finetune {task.name}: the student learns from {1 - TEACHER_KD:g} x the labels' loss + {TEACHER_KD:g} x "
              f"the teacher's soft targets (T = {TEACHER_T:g})", file=sys.stderr, flush=True)
    if freeze_embeddings:
        net.backbone.embeddings.tok.weight.requires_grad_(False)
    from ..training.checkpoint import list_checkpoints
    if setfit_steps and not (resume and list_checkpoints(output)):  # a resumed run's checkpoint holds its result
        from .setfit import SETFIT_BATCH, SETFIT_LR, contrastive_stage
        t0 = time.time()
        losses = contrastive_stage(net, feats, tokenizer.pad_token_id, setfit_steps, seed=seed, pairing=setfit_pairs)
        k = max(1, len(losses) // 10)
        pairs = (f"{setfit_steps * SETFIT_BATCH:,} pairs" if setfit_pairs == "sampled" else
                 f"every pair in batches of {SETFIT_BATCH} sentences, {setfit_steps * SETFIT_BATCH * (SETFIT_BATCH - 1) // 2:,} pairs")
        print(f"finetune {task.name}: SetFit stage: {setfit_steps} pair steps ({pairs} "
              f"of training sentences, lr {SETFIT_LR:g}), because {setfit_why}; pair loss "
              f"{sum(losses[:k]) / k:.3f} -> {sum(losses[-k:]) / k:.3f}, {time.time() - t0:.0f} s",
              file=sys.stderr, flush=True)
    # the default is BERT's fresh head: the probe start measured no better (research/fewlabel/RESULTS.md)
    head_init = head_init or "random"
    if head_init == "probe":
        from .probe import probe_init
        t0 = time.time()
        fit = probe_init(net, feats, tokenizer.pad_token_id)
        print(f"finetune {task.name}: head warm-started from a linear probe on the frozen sentence vectors "
              f"({fit:.1f}% on the training examples, {time.time() - t0:.0f} s)", file=sys.stderr, flush=True)

    lengths, pad_id = [len(f["input_ids"]) for f in feats], tokenizer.pad_token_id
    rank, world, _ = distributed_context()
    # under torchrun every process takes its share of each batch (the global batch is batch_size); a batch
    # that does not divide evenly weighs each process's mean equally, a batch smaller than the number of
    # processes gives the short ones its last example again
    data = EpochBatches(lambda epoch: length_batches(lengths, batch_size, shuffle=True, seed=seed + epoch),
                        lambda idx: collate([feats[i] for i in (idx[rank::world] or idx[-1:])], pad_id,
                                            COMPILE_PAD if compile else 1))
    steps_per_epoch = len(data)
    total = max(1, math.ceil(steps_per_epoch * epochs)) if epochs else 0
    pooled = type(net).__name__ == "SequenceClassification"
    print(f"finetune {task.name}: {total} steps = {epochs:g} epochs of {steps_per_epoch} batches of {batch_size}, "
          f"lr {lr:g}" + (f" (x{layer_decay:g} a layer down)" if layer_decay != 1.0 else "")
          + (f", weights averaged (EMA {ema:g})" if ema else "")
          + (f", {net.config.classifier_pooling} pooling" if pooled else ""), file=sys.stderr, flush=True)
    if not resume:
        (output / "metrics.jsonl").write_text("")  # this run's log (the Trainer appends)
    args = TrainArgs(output_dir=str(output), max_steps=max(1, total), lr=lr, warmup_steps=int(total * warmup_ratio),
                     schedule="linear", weight_decay=weight_decay, layer_decay=layer_decay, ema=ema, eps=1e-8,
                     clip_norm=1.0, seed=seed, eval_every=eval_every or steps_per_epoch, log_every=log_every,
                     save_every=save_every, keep_last=2 if save_every else 0, resume=resume, parallel=parallel,
                     progress=progress, best_metric=task.main_metric, patience=patience or 0, compile=compile,
                     precision=precision, max_minutes=max_minutes or 0.0)

    base_name = str(model)

    def save_best(model) -> None:  # the best checkpoint is the one kept, in the output itself
        if lora:  # the adapter alone, and the merged model that evaluate/predict load like any other
            from ..interop.peft import merged_copy, save_adapter
            save_adapter(model, output / "adapter", base_model_name_or_path=base_name)
            model = merged_copy(model)
        save_model(model, output)
        tokenizer.save(output)

    def on_best(model, record: dict) -> None:  # a full disk: one line, the model kept before stays whole
        keep_best(lambda: save_best(model), output, record["step"])

    student_of = lambda model: getattr(model, "student", model)  # noqa: E731  (a Distillation holds it)
    trainer = Trainer(trained, args, data, loss_fn=loss_fn,
                      evaluate_fn=lambda model: evaluate_examples(task, student_of(model), tokenizer, valid_ex,
                                                                  max_length)[0],
                      on_best=lambda model, record: on_best(student_of(model), record))
    for frozen in (teacher, soft_teacher):
        if frozen is not None:
            frozen.to(trainer.device)
    if total:
        trainer.train()
        step, best = trainer.step, trainer.best
    else:  # SetFit's probe-fitted head with no fine-tuning after: score it (when there is validation data), keep it
        step, best = 0, {"step": 0, **(trainer.evaluate() if valid_ex else {})}
        on_best(net, best)
    stopped_by = trainer.stopped_by if total else ""

    summary = {"task": task.name, "model": str(model), "train": train_path, "valid": valid_desc,
               "train_examples": len(train_ex), "valid_examples": len(valid_ex), "steps": step,
               "best_step": best.get("step"),
               **({"max_minutes": max_minutes, "stopped_by_time": stopped_by == "max_minutes"} if max_minutes else {}),
               "epochs": epochs, "lr": lr, "batch_size": batch_size,
               "max_length": max_length, "seed": seed, "freeze_embeddings": freeze_embeddings,
               "precision": trainer.precision,  # "auto" resolved
               **({"layer_decay": layer_decay} if layer_decay != 1.0 else {}), **({"ema": ema} if ema else {}),
               **({"pooling": net.config.classifier_pooling, "head_init": head_init, "setfit_steps": setfit_steps,
                  **({"setfit_pairs": setfit_pairs} if setfit_steps else {})}
                  if pooled else {}),
               **({"from_scratch": True} if from_scratch else {}),
               **({"labeled_examples": n_labeled, "self_training": self_info} if self_train else {}),
               **({"teacher": {**teacher_info, "kd": TEACHER_KD, "temperature": TEACHER_T}} if lm_teacher else {}),
               **({"self_distillation": {"weight": self_distill, "temperature": SELF_DISTILL_T,
                                         "teacher": str(teacher_dir), "teacher_best_step": teacher_summary.get("best_step"),
                                         **{f"teacher_{k}": v for k, v in teacher_summary.items()
                                            if k.startswith("eval_")}}} if self_distill else {}),
               **({"lora": lora, "trainable_parameters": sum(p.numel() for p in net.parameters() if p.requires_grad)}
                  if lora else {}),
               **({"student_layers": student_layers, "teacher_layers": teacher.config.num_layers,
                   "student_width": net.config.hidden_size, "student_heads": net.config.num_heads,
                   "distill": vars(trained.cfg),
                   "parameters": net.num_parameters(), "teacher_parameters": teacher.num_parameters()}
                  if teacher is not None else {}),
               "wall_time_s": round(time.time() - started, 1),
               **{k: v for k, v in best.items() if k.startswith("eval_")}}
    if test_file is not None and rank == 0:
        scores = evaluate(task, output, test_ex, max_length=max_length)
        tested = {f"test_{k}": v for k, v in scores.items() if k not in ("task", "examples")}
        summary.update({"test": str(test_file), "test_examples": scores["examples"], **tested})
        print(f"finetune {task.name}: the kept model (step {best.get('step')}) on {test_file}: "
              + ", ".join(f"{k}={v}" for k, v in tested.items()), file=sys.stderr, flush=True)
    atomic_write(output / "metrics.json", lambda tmp: Path(tmp).write_text(json.dumps(summary, indent=2) + "\n"))
    return summary


def _self_training_spans(task: Task, per_sentence: int, why: str, teacher_dir: Path, teacher: dict,
                         train_ex: list[dict], max_length: int, seed: int) -> tuple[list[dict], dict]:
    """The self-training stage (tasks/selftrain.py): the spans of the training sentences that the teacher (a
    plain fine-tune of the same split, in `teacher_dir`; `teacher` its summary) labels confidently, as training
    examples, and what the summary says of them."""
    from .selftrain import CONFIDENCE, confident_labels, random_spans
    t0 = time.time()
    net, tokenizer = _load_for_eval(task, teacher_dir)
    labels, label2id = labels_of(net)
    spans = random_spans([e["texts"][0] for e in train_ex], per_sentence, seed)
    feats = task.features([{"texts": [s]} for s in spans], tokenizer, max_length, label2id, training=False)
    kept = confident_labels(net, feats, tokenizer.pad_token_id, labels, CONFIDENCE)
    examples = [{"texts": [spans[i]], "label": label, "source": "self-training spans", "line": i + 1}
                for i, label, _ in kept]
    share = {label: sum(e["label"] == label for e in examples) for label in labels}
    print(f"finetune {task.name}: the teacher (step {teacher.get('best_step')}, {task.main_metric} "
          f"{teacher.get('eval_' + task.main_metric)}) labeled {len(kept)} of {len(spans)} spans with probability "
          f">= {CONFIDENCE:g} ({', '.join(f'{k}: {v}' for k, v in share.items())}; {time.time() - t0:.0f} s); "
          "the kept model is a fresh copy trained on them and the labeled examples", file=sys.stderr, flush=True)
    return examples, {"spans_per_sentence": per_sentence, "spans": len(spans), "span_examples": len(examples),
                      "confidence": CONFIDENCE, "why": why, "teacher": str(teacher_dir),
                      "teacher_best_step": teacher.get("best_step"),
                      **{f"teacher_{k}": v for k, v in teacher.items() if k.startswith("eval_")}}


def head_class(task: Task):
    """The attnlab wrapper class a task trains (tasks name it by its BERT class, e.g. BertForTokenClassification)."""
    from ..interop.registry import FAMILIES
    return FAMILIES["bert"].architectures[task.architecture][0]


def load_for_task(task: Task, model: str | Path, extra: dict, pooling: str | None = None):
    """`model` with the task's head: the family's own class for it when it has one (RobertaForSequenceClassification
    for a RoBERTa), else the same head over the model's backbone (an ELECTRA discriminator, or a pretraining
    checkpoint saved in attnlab's own layout, gets a pooler and a classifier), which `save_model` then writes
    in attnlab's own layout. `pooling` ("cls" / "mean") sets a sequence classifier's
    config.classifier_pooling; None keeps the checkpoint's."""
    from dataclasses import replace

    from ..interop import load
    from ..interop.hf import config_from_hf_dir
    from ..interop.registry import FAMILIES
    from ..interop.local import resolve
    path = resolve(model)
    cls = head_class(task)
    net = None
    if path.suffix.lower() == ".gguf":
        net = load(path, architecture=task.architecture, extra=extra)
    elif (path / "config.json").exists():
        config, _ = config_from_hf_dir(path)
        family = FAMILIES[config.model_type]
        names = [name for name, (c, _) in family.architectures.items() if c is cls]
        if names:
            net = load(path, architecture=names[0], extra=extra)
    if net is None:
        loaded = load(path)  # attnlab's own layout names its class (e.g. a pre-LN BertForPreTraining)
        net = load(path, extra=extra) if isinstance(loaded, cls) else loaded
    if isinstance(net, cls) and (pooling is None or net.config.classifier_pooling == pooling):
        return net
    # a new head over the loaded backbone: another head class, or another classifier pooling
    backbone = getattr(net, "backbone", net)
    config = replace(net.config, extra={**net.config.extra, **extra})
    if pooling is not None:
        config = replace(config, classifier_pooling=pooling)
    config = replace(config, pooler=config.pooler or cls.reads_pooler(config))
    fresh = cls(config)
    missing, unexpected = fresh.backbone.load_state_dict(backbone.state_dict(), strict=False)
    unexpected = [k for k in unexpected if not k.startswith("pooler.")]  # a mean-pooling head reads no pooler
    if unexpected or any(not k.startswith("pooler.") for k in missing):
        raise ValueError(f"{path}: its backbone does not fit a {cls.__name__} (missing {missing}, unexpected {unexpected})")
    return fresh


def _load_for_eval(task: Task, model: str | Path):
    from ..interop import load, load_tokenizer
    net = load(model)
    if not isinstance(net, head_class(task)):
        raise ValueError(f"{model}: holds a {net.hf_architecture or type(net).__name__}, but task {task.name} "
                         f"needs a {task.architecture} (fine-tune it first: attnlab finetune {task.name} ...)")
    return net, load_tokenizer(model)


def _trained_max_length(task: Task, model: str | Path, max_length: int | None) -> int:
    """What the caller asks for, else what the model was fine-tuned with (its metrics.json), else the
    task default: inputs longer than in training are cut the same way."""
    if max_length:
        return max_length
    summary = Path(model) / "metrics.json"
    if summary.is_file():
        try:
            return int(json.loads(summary.read_text())["max_length"])
        except (ValueError, KeyError, TypeError):
            pass
    return task.hyper.get("max_length", 128)


def evaluate(task: str | Task, model: str | Path, data: str | Path | list[dict], *, max_length: int | None = None,
             batch_size: int = 64, progress: bool = False, dtype: str = "fp32") -> dict:
    """Metrics of a fine-tuned model on a labelled file in the task's format (or on examples already read
    from one). dtype: "fp32", "bf16", or "int8" (inference/quantize.py, calibrated on its bundled sentences)."""
    task = get_task(task) if isinstance(task, str) else task
    net, tokenizer = _load_for_eval(task, model)
    if dtype != "fp32":
        from ..inference.quantize import calibration_batches, quantize
        net = quantize(net, dtype, inplace=True,
                       calibration=calibration_batches(tokenizer) if dtype == "int8" else None)
    examples = data if isinstance(data, list) else read_many(task, data)
    scores, _ = evaluate_examples(task, net, tokenizer, examples, _trained_max_length(task, model, max_length),
                                  batch_size, progress)
    return {"task": task.name, "examples": len(examples), **({"dtype": dtype} if dtype != "fp32" else {}),
            **{k: round(v, 4) for k, v in scores.items()}}


def predict(task: str | Task, model: str | Path, input: str | Path, output: str | Path, *,
            max_length: int | None = None, batch_size: int = 64, progress: bool = False) -> int:
    """Write predictions for unlabelled inputs; returns how many were written."""
    task = get_task(task) if isinstance(task, str) else task
    net, tokenizer = _load_for_eval(task, model)
    examples = task.read_inputs(input)
    if not examples:
        raise DataError(f"{input}: no inputs found")
    preds = task.predict(net, tokenizer, examples, _trained_max_length(task, model, max_length), batch_size,
                         progress)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    task.write_predictions(examples, preds, output)
    return len(preds)
