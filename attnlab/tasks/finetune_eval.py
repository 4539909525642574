"""A model with a task's head, for training (`load_for_task`) or for use once fine-tuned (`load_for_eval`), and
what a fine-tuned model does: `evaluate` on labelled data, `predict` on unlabelled inputs."""
from __future__ import annotations

import json
from pathlib import Path

from .base import Task, get_task
from .common import DataError
from .splits import read_many


def evaluate_examples(task: Task, model, tokenizer, examples: list[dict], max_length: int,
                      batch_size: int = 64, progress: bool = False) -> tuple[dict, list]:
    """(the task's metrics, the predictions) of `model` on labelled `examples`."""
    predictions = task.predict(model, tokenizer, examples, max_length, batch_size, progress)
    return task.score(examples, predictions), predictions


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


def load_for_eval(task: Task, model: str | Path):
    """A model fine-tuned on `task` and its tokenizer; another head is an error naming what it holds."""
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
    net, tokenizer = load_for_eval(task, model)
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
    net, tokenizer = load_for_eval(task, model)
    examples = task.read_inputs(input)
    if not examples:
        raise DataError(f"{input}: no inputs found")
    preds = task.predict(net, tokenizer, examples, _trained_max_length(task, model, max_length), batch_size,
                         progress)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    task.write_predictions(examples, preds, output)
    return len(preds)
