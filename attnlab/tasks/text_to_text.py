"""GLUE as text-to-text (T5, Raffel et al. 2020, §2.4 and appendix D): the input is the task's name and its
fields as text, the target is the label as a word, and the model is scored on what it GENERATES.

    sst2 sentence: it 's a charming and often affecting journey .   ->  positive
    mrpc sentence1: ... sentence2: ...                              ->  equivalent / not_equivalent
    stsb sentence1: ... sentence2: ...                              ->  3.8   (the score rounded to 0.2, §2.4)

Training is teacher-forced cross-entropy on the target's tokens; evaluation decodes greedily and maps the
string back to a label. A string that is no label word (or, for STS-B, no number in [0, 5]) is *unknown*: it
counts as wrong (a binary task scores it as the label opposite to the gold one; STS-B as -1, the default of
T5's `string_to_float` postprocessor) and is reported, counted and with examples, in the metrics.
The mapping (prefix, field names, label words) is saved in the model's config.json under `text_to_text`,
so `evaluate` / `predict` read the model's own mapping, not this module's table.

    summary = finetune_text_to_text("sst2", "t5-small", "out/t5-sst2", overrides={"hidden_size": 256})
    evaluate_text_to_text("out/t5-sst2", "dev.tsv")       # {"accuracy": ..., "unknown": 3, ...}

`model` is a T5 preset (random weights, resized by `overrides`; a BPE vocabulary is learned on the training
prompts and targets, as for translation) or a directory holding an encoder-decoder checkpoint and its
tokenizer (Hugging Face's T5 layout: T5ForConditionalGeneration).
"""
from __future__ import annotations

import json
import math
import sys
import tempfile
import time
from pathlib import Path

import torch

from .base import get_task
from .common import DataError, length_batches
from .splits import read_splits
from .translation import encode, pad, train_joint_bpe

# task -> (prefix, field names, label -> word); None: a regression target written as a number (STS-B).
# Appendix D's words; MNLI/QNLI/QQP/WNLI are not among attnlab's tasks (no data under ATTNLAB_DATA).
FORMATS: dict[str, tuple[str, tuple[str, ...], dict[str, str] | None]] = {
    "sst2": ("sst2", ("sentence",), {"0": "negative", "1": "positive"}),
    "cola": ("cola", ("sentence",), {"0": "unacceptable", "1": "acceptable"}),
    "mrpc": ("mrpc", ("sentence1", "sentence2"), {"0": "not_equivalent", "1": "equivalent"}),
    "rte": ("rte", ("sentence1", "sentence2"), {"entailment": "entailment", "not_entailment": "not_entailment"}),
    "stsb": ("stsb", ("sentence1", "sentence2"), None),
}
class TextToTextError(ValueError):
    """A task without a text-to-text format, or a model that is no encoder-decoder: the CLI exits with 2."""
    exit_status = 2


UNKNOWN_SCORE = -1.0   # an STS-B string that is no number in [0, 5] (T5's string_to_float default)
SHOW_UNKNOWN = 5       # unknown strings kept as examples in the metrics


def text_format(task: str) -> dict:
    """The mapping saved with a model: {"task", "prefix", "fields", "words"} (words None for STS-B)."""
    if task not in FORMATS:
        raise TextToTextError(f"--text-to-text: task {task!r} has no text-to-text format; choose one of "
                         f"{', '.join(FORMATS)}")
    prefix, fields, words = FORMATS[task]
    return {"task": task, "prefix": prefix, "fields": list(fields), "words": words}


def prompt(fmt: dict, texts) -> str:
    """'sst2 sentence: ...' / 'rte sentence1: ... sentence2: ...'."""
    if len(texts) != len(fmt["fields"]):
        raise DataError(f"{fmt['task']}: {len(fmt['fields'])} field(s) expected, got {len(texts)}")
    return " ".join([fmt["prefix"], *(f"{f}: {t.strip()}" for f, t in zip(fmt["fields"], texts))])


def target(fmt: dict, label) -> str:
    """The label as the model must write it: its word, or an STS-B score rounded to the nearest 0.2."""
    if fmt["words"] is None:
        return f"{round(float(label) * 5) / 5:.1f}"
    if str(label) not in fmt["words"]:
        raise DataError(f"{fmt['task']}: label {label!r} has no word (known: {', '.join(fmt['words'])})")
    return fmt["words"][str(label)]


def parse(fmt: dict, text: str):
    """The label a generated string names, or None (unknown)."""
    text = text.strip()
    if fmt["words"] is None:
        try:
            value = float(text)
        except ValueError:
            return None
        return value if 0.0 <= value <= 5.0 else None
    for label, word in fmt["words"].items():
        if text == word:
            return label
    return None


def score_strings(task: str, fmt: dict, examples: list[dict], strings: list[str]) -> dict:
    """The task's metrics on the labels the strings name, plus `unknown` (count) and `unknown_examples`."""
    preds, unknown = [], []
    for ex, s in zip(examples, strings):
        label = parse(fmt, s)
        if label is None:
            unknown.append(s)
            if fmt["words"] is None:
                label = UNKNOWN_SCORE
            else:  # wrong by construction, also for F1 / MCC (every supported task is binary)
                label = next(l for l in fmt["words"] if l != str(ex["label"]))
        preds.append(label)
    scores = get_task(task).score(examples, preds)
    return {**{k: round(v, 4) for k, v in scores.items()}, "unknown": len(unknown),
            "unknown_examples": unknown[:SHOW_UNKNOWN]}


@torch.inference_mode()
def generate_strings(model, tokenizer, prompts: list[str], fmt: dict, max_length: int = 128,
                     batch_size: int = 64) -> list[str]:
    """Greedy decoding of each prompt, in input order; a few tokens more than the longest target allow."""
    from ..inference.seq2seq import generate
    longest = max(len(r) for r in encode(tokenizer, _all_targets(fmt), max_length))  # counts </s>
    rows = encode(tokenizer, prompts, max_length, "inputs")
    pad_id = model.config.pad_token_id or 0
    was_training = model.training
    model.eval()
    out = [""] * len(prompts)
    for batch in length_batches([len(r) for r in rows], batch_size, shuffle=False):
        ids = pad([rows[i] for i in batch], pad_id)
        gen = generate(model, ids, (ids != pad_id).long(), max_new_tokens=longest + 2)
        for i, text in zip(batch, tokenizer.batch_decode(gen[:, 1:].tolist())):
            out[i] = text.strip()
    model.train(was_training)
    return out


def _all_targets(fmt: dict) -> list[str]:
    return list(fmt["words"].values()) if fmt["words"] is not None else ["0.0", "2.4", "5.0"]


def t5_init(model) -> None:
    """T5's initialisation (Mesh TensorFlow's, as transformers' T5PreTrainedModel with factor 1): embeddings
    N(0, 1), q N(0, (d d_kv)^-1/2) (the 1/sqrt(d_k) that T5's unscaled q.k leaves out, §2.1), k, v and the
    FFN input N(0, d^-1/2), attention output N(0, (h d_kv)^-1/2), FFN output N(0, d_ff^-1/2). The BERT init
    (N(0, 0.02)) that a fresh Seq2SeqLM gets leaves T5's d^-1/2-rescaled tied logits near zero: measured, a
    4x256 model's loss stayed at 4.3 after 300 steps on SST-2's two label words."""
    cfg = model.config
    d, inner = cfg.hidden_size, cfg.num_heads * cfg.dim_head
    std = {"q": (d * cfg.dim_head) ** -0.5, "k": d ** -0.5, "v": d ** -0.5, "o": inner ** -0.5,
           "up": d ** -0.5, "gate": d ** -0.5, "down": cfg.intermediate_size ** -0.5}
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 2)[-2] if name.count(".") >= 1 else name
            if name.endswith("embeddings.tok.weight"):
                p.normal_(0.0, 1.0)
            elif name.startswith("lm_head") or "relative_bias" in name:
                p.normal_(0.0, d ** -0.5)
            elif p.dim() == 2 and leaf in std:
                p.normal_(0.0, std[leaf])


def _start(model: str | Path, overrides: dict | None):
    """(config, None) for a T5 preset (weights to come), or (None, the loaded encoder-decoder): checked before
    any data is read, so that a wrong --model fails at once."""
    from ..config import PRESETS, preset
    from ..interop import load
    from ..models.seq2seq import Seq2SeqLM
    if str(model) in PRESETS:
        cfg = preset(str(model), **{k: v for k, v in (overrides or {}).items() if not k.startswith("extra.")})
        if cfg.model_type != "t5":
            raise TextToTextError(f"--model {model}: a {cfg.model_type} preset; --text-to-text needs a T5 "
                                  "(t5-small, t5-v1_1-small, ...)")
        extra = {**cfg.extra, "decoder_start_token_id": 0}
        if "num_layers" in (overrides or {}):  # a resized stack: the decoder follows
            extra["num_decoder_layers"] = overrides["num_layers"]
        extra.update({k[len("extra."):]: v for k, v in (overrides or {}).items() if k.startswith("extra.")})
        return cfg.replace(pad_token_id=0, eos_token_id=1, extra=extra), None
    if overrides:
        raise TextToTextError(f"--set applies to a preset (random weights), not to the checkpoint {model}")
    net = load(model)
    if not isinstance(net, Seq2SeqLM):
        raise TextToTextError(f"--model {model}: holds a {net.hf_architecture or type(net).__name__}; "
                              "--text-to-text needs an encoder-decoder (T5ForConditionalGeneration) or a T5 preset")
    return None, net


def _fresh(cfg, texts: list[str], vocab_size: int):
    """(random-weight T5, BPE vocabulary learned on `texts`: the training prompts and targets)."""
    from ..models.seq2seq import Seq2SeqLM
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "text.txt"
        corpus.write_text("".join(t + "\n" for t in texts), encoding="utf-8")
        tok = train_joint_bpe([corpus], vocab_size)
    net = Seq2SeqLM(cfg.replace(vocab_size=tok.vocab_size))
    t5_init(net)
    return net, tok


def finetune_text_to_text(task: str, model: str | Path, output: str | Path, *, train_file=None, valid_file=None,
                          overrides: dict | None = None, epochs: float | None = None, lr: float | None = None,
                          batch_size: int = 32, max_length: int = 128, max_minutes: float | None = None,
                          max_train_samples: int | None = None, max_eval_samples: int | None = None,
                          seed: int = 42, vocab_size: int = 8000, eval_every: int | None = None,
                          patience: int | None = None, progress: bool = True, log_every: int = 50) -> dict:
    """Train `model` (a T5 preset or checkpoint) to write `task`'s label words; keep the checkpoint with the
    best validation metric, computed from generated strings. Data and the held-out split as `finetune`.
    Defaults: lr 5e-4 from random weights, 1e-4 from a checkpoint; epochs enough for 300 steps (at least 3)."""
    from ..interop.files import atomic_write
    from ..interop.native import save_model
    from ..training import TrainArgs, Trainer
    from ..training.checkpoint import keep_best
    from .common import EpochBatches
    from ..interop import load_tokenizer
    fmt = text_format(task)
    spec = get_task(task)
    cfg, net = _start(model, overrides)
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    train_path, train_ex, valid_ex, valid_desc, note = read_splits(
        spec, train_file, valid_file, None, max_train_samples, max_eval_samples, seed)
    print(f"finetune {task} --text-to-text: train {len(train_ex)} examples, validate {len(valid_ex)} ({note})",
          file=sys.stderr, flush=True)
    prompts = [prompt(fmt, ex["texts"]) for ex in train_ex]
    targets = [target(fmt, ex["label"]) for ex in train_ex]
    fresh = net is None
    net, tok = _fresh(cfg, prompts + targets, vocab_size) if fresh else (net, load_tokenizer(model))
    net.config.extra["text_to_text"] = fmt   # saved in config.json: evaluate / predict read it
    src = encode(tok, prompts, max_length, "training inputs")
    tgt = encode(tok, targets, max_length, "targets")
    lr = lr if lr is not None else (5e-4 if fresh else 1e-4)
    steps_per_epoch = math.ceil(len(src) / batch_size)
    epochs = epochs if epochs is not None else max(3, math.ceil(300 / steps_per_epoch))
    total = max(1, math.ceil(epochs * steps_per_epoch))

    def make(idx: list[int]) -> dict:
        ids = pad([src[i] for i in idx], 0)
        return {"input_ids": ids, "attention_mask": (ids != 0).long(), "labels": pad([tgt[i] for i in idx], -100)}

    data = EpochBatches(lambda epoch: length_batches([len(r) for r in src], batch_size, shuffle=True,
                                                     seed=seed + epoch), make)
    print(f"finetune {task} --text-to-text: {net.num_parameters():,} parameters, vocabulary {tok.vocab_size}, "
          f"{total} steps = {epochs:g} epochs of {steps_per_epoch} batches of {batch_size}, lr {lr:g}",
          file=sys.stderr, flush=True)
    (output / "metrics.jsonl").write_text("")
    args = TrainArgs(output_dir=str(output), max_steps=total, max_minutes=max_minutes or 0.0, lr=lr,
                     warmup_steps=int(0.1 * total), schedule="linear", weight_decay=0.01, eps=1e-8, clip_norm=1.0,
                     seed=seed, eval_every=eval_every or steps_per_epoch, log_every=log_every, keep_last=0,
                     progress=progress, best_metric=spec.main_metric, patience=patience or 0)
    last: dict = {}
    best: dict = {}
    valid_prompts = [prompt(fmt, ex["texts"]) for ex in valid_ex]

    def evaluate(model) -> dict:
        last.clear()
        last.update(score_strings(task, fmt, valid_ex, generate_strings(model, tok, valid_prompts, fmt, max_length)))
        if last["unknown"]:  # printed as they happen; the best step's are kept in metrics.json
            print(f"finetune {task} --text-to-text: {last['unknown']} of {len(valid_ex)} generated strings name no "
                  f"label, e.g. {last['unknown_examples'][:3]}", file=sys.stderr, flush=True)
        return {k: v for k, v in last.items() if isinstance(v, (int, float))}

    def on_best(model, record: dict) -> None:
        best.clear()
        best.update(last, step=record["step"])
        keep_best(lambda: (save_model(model, output), tok.save(output)), output, record["step"])

    started = time.time()
    trainer = Trainer(net, args, data, evaluate_fn=evaluate, on_best=on_best,
                      count_tokens=lambda b: int(b["attention_mask"].sum()) + int((b["labels"] != -100).sum()))
    trainer.train()
    summary = {"task": task, "text_to_text": True, "model": str(model), "train": train_path, "valid": valid_desc,
               "train_examples": len(train_ex), "valid_examples": len(valid_ex), "steps": trainer.step,
               "epochs": epochs, "lr": lr, "batch_size": batch_size, "max_length": max_length, "seed": seed,
               "parameters": net.num_parameters(), "vocab_size": tok.vocab_size,
               "wall_time_s": round(time.time() - started, 1), "best_step": best.get("step"),
               **{f"eval_{k}": v for k, v in best.items() if k != "step"}}
    atomic_write(output / "metrics.json", lambda tmp: Path(tmp).write_text(json.dumps(summary, indent=2) + "\n"))
    return summary


# ----------------------------------------------------------------------------------- saved models
def saved_format(model: str | Path) -> dict | None:
    """The text-to-text mapping a model directory was trained with (config.json's `text_to_text`), or None."""
    config = Path(model) / "config.json"
    if not config.is_file():
        return None
    try:
        return json.loads(config.read_text(encoding="utf-8")).get("text_to_text")
    except (ValueError, AttributeError):
        return None


def _load(task: str, model: str | Path):
    from ..interop import load, load_tokenizer
    fmt = saved_format(model)
    if fmt is None:
        raise ValueError(f"{model}: config.json has no text_to_text mapping (train it with "
                         f"attnlab finetune {task} --text-to-text)")
    if fmt["task"] != task:
        raise ValueError(f"{model}: trained as text-to-text for {fmt['task']}, not {task}")
    return load(model), load_tokenizer(model), fmt


def evaluate_text_to_text(task: str, model: str | Path, data: str | Path, *, max_length: int | None = None,
                          batch_size: int = 64) -> dict:
    """Metrics from generated strings on a labelled file in the task's format, with the unknown strings."""
    net, tok, fmt = _load(task, model)
    examples = get_task(task).read(data)
    strings = generate_strings(net, tok, [prompt(fmt, ex["texts"]) for ex in examples], fmt, max_length or 128, batch_size)
    return {"task": task, "text_to_text": True, "examples": len(examples),
            **score_strings(task, fmt, examples, strings)}


def predict_text_to_text(task: str, model: str | Path, input: str | Path, output: str | Path, *,
                         max_length: int | None = None, batch_size: int = 64) -> int:
    """One line per input: the label the generated string names, or `?` and the string when it names none
    (counted on stderr). Returns how many lines were written."""
    net, tok, fmt = _load(task, model)
    examples = get_task(task).read_inputs(input)
    if not examples:
        raise DataError(f"{input}: no inputs found")
    strings = generate_strings(net, tok, [prompt(fmt, ex["texts"]) for ex in examples], fmt, max_length or 128, batch_size)
    labels = [parse(fmt, s) for s in strings]
    unknown = sum(label is None for label in labels)
    if unknown:
        print(f"predict {task}: {unknown} of {len(labels)} generated strings name no label (written as ?STRING)",
              file=sys.stderr)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text("".join(f"{s if s is not None else '?' + t}\n" for s, t in zip(labels, strings)),
                      encoding="utf-8")
    return len(labels)
