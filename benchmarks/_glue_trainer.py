"""The transformers side of glue_vs_transformers.py, run as its own process: transformers' Trainer with the
defaults of its run_glue example (AutoModelForSequenceClassification, lr 2e-5, batch 32, 3 epochs, max length
128, weight decay 0, no warmup, linear decay, seed set before the model is built, no evaluation during
training, no checkpoints), then predictions on the report set, scored by the same metric code as attnlab's.

For a CoNLL task (examples of words and tags) it runs run_ner's recipe instead (NER_RECIPE, token
classification, the first piece of each word labelled).

    python benchmarks/_glue_trainer.py --task rte --train train.tsv --report dev.tsv --model-dir DIR \
        --seed 1 --threads 2 --padding dynamic --output DIR --result result.json

The files are read by attnlab's task readers, so both sides see the same examples. The result JSON holds the
metrics, the time training ended (time.time(), so the caller measures wall time from the process's launch
to the end of training) and the CPU seconds the process had used by then."""
from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

RECIPE = dict(learning_rate=2e-5, per_device_train_batch_size=32, num_train_epochs=3, max_seq_length=128,
              weight_decay=0.0, warmup_steps=0, lr_scheduler_type="linear")
# run_ner's: TrainingArguments' own defaults (lr 5e-5, batch 8), 3 epochs, the tokenizer's length limit, only a
# word's first piece labelled (label_all_tokens off), each batch padded to its longest
NER_RECIPE = dict(learning_rate=5e-5, per_device_train_batch_size=8, num_train_epochs=3, max_seq_length=512,
                  weight_decay=0.0, warmup_steps=0, lr_scheduler_type="linear")


def pieces(tok, examples: list[dict]):
    """The examples' words as pieces, cut at run_ner's length limit (a BatchEncoding with word_ids)."""
    return tok([ex["words"] for ex in examples], is_split_into_words=True, truncation=True,
               max_length=NER_RECIPE["max_seq_length"])


def first_pieces(word_ids: list[int | None]):
    """(piece index, word index) of each word's first piece: the pieces run_ner labels (label_all_tokens off)."""
    previous = None
    for j, w in enumerate(word_ids):
        if w is not None and w != previous:
            yield j, w
        previous = w


def encode_words(enc, examples: list[dict], label2id: dict) -> list[dict]:
    """run_ner's tokenize_and_align_labels on `pieces(tok, examples)`: the first piece of a word gets its tag,
    the rest and the special tokens -100."""
    rows = []
    for i, ex in enumerate(examples):
        labels = [-100] * len(enc["input_ids"][i])
        for j, w in first_pieces(enc.word_ids(i)):
            labels[j] = label2id[ex["tags"][w]]
        rows.append({**{k: enc[k][i] for k in enc.keys()}, "labels": labels})
    return rows


def word_tags(enc, examples: list[dict], logits, labels: list[str]) -> list[list[str]]:
    """Each word's tag from its first piece's logits; words cut off by the length limit are "O"."""
    import numpy as np
    out = []
    for i, ex in enumerate(examples):
        tags = ["O"] * len(ex["words"])
        for j, w in first_pieces(enc.word_ids(i)):
            tags[w] = labels[int(np.argmax(logits[i][j]))]
        out.append(tags)
    return out


def encode(tok, examples: list[dict], label2id: dict | None, padding: str) -> list[dict]:
    """run_glue's preprocessing: sentence (or pair) to ids, cut at max_seq_length, padded to it when asked."""
    first = [ex["texts"][0] for ex in examples]
    second = [ex["texts"][1] for ex in examples] if len(examples[0]["texts"]) > 1 else None
    enc = tok(first, second, truncation=True, max_length=RECIPE["max_seq_length"],
              padding="max_length" if padding == "max" else False)
    rows = []
    for i, ex in enumerate(examples):
        row = {k: enc[k][i] for k in enc.keys()}
        row["labels"] = float(ex["label"]) if label2id is None else label2id[ex["label"]]
        rows.append(row)
    return rows


def training_args(tf, args, recipe: dict):
    """The recipe as TrainingArguments: no evaluation during training, no checkpoints, CPU."""
    return tf.TrainingArguments(
        output_dir=args.output, seed=args.seed, learning_rate=recipe["learning_rate"],
        per_device_train_batch_size=recipe["per_device_train_batch_size"],
        num_train_epochs=recipe["num_train_epochs"], weight_decay=recipe["weight_decay"],
        warmup_steps=recipe["warmup_steps"], lr_scheduler_type=recipe["lr_scheduler_type"],
        eval_strategy="no", save_strategy="no", report_to="none", disable_tqdm=True, use_cpu=True)


def write_result(args, trainer, metrics: dict, trained: tuple[float, float], predict_start: float, n_train: int,
                 n_report: int, padding: str, recipe: dict) -> None:
    """The result JSON the caller reads: metrics, `trained` = (time.time(), CPU seconds) when training ended
    (`training_done()`), how long the predictions took, and the recipe."""
    import torch
    import transformers as tf
    train_end, cpu = trained
    Path(args.result).write_text(json.dumps({
        "metrics": {k: round(v, 4) for k, v in metrics.items()}, "train_end": train_end,
        "cpu_s": round(cpu, 1), "predict_s": round(time.perf_counter() - predict_start, 1),
        "train_examples": n_train, "report_examples": n_report, "steps": trainer.state.global_step,
        "padding": padding, "threads": torch.get_num_threads(), "transformers": tf.__version__, **recipe}))


def training_done() -> tuple[float, float]:
    """(wall clock, this process's CPU seconds) at the end of training."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return time.time(), usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", required=True, help="attnlab's task name, whose reader reads the files")
    ap.add_argument("--train", required=True)
    ap.add_argument("--report", required=True)
    ap.add_argument("--model-dir", required=True, help="a Hugging Face model directory")
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--padding", choices=("max", "dynamic"), required=True)
    ap.add_argument("--output", required=True, help="the Trainer's output_dir (it writes no checkpoint)")
    ap.add_argument("--result", required=True, help="JSON file to write")
    args = ap.parse_args()

    import numpy as np
    import torch
    torch.set_num_threads(args.threads)
    import transformers as tf
    from attnlab.tasks import get_task

    task = get_task(args.task)
    train_ex, report_ex = task.read(args.train), task.read(args.report)
    if "words" in train_ex[0]:
        return token_classification(args, task, train_ex, report_ex)
    regression = bool(getattr(task, "regression", False))
    labels = None if regression else sorted({ex["label"] for ex in train_ex})
    label2id = None if labels is None else {name: i for i, name in enumerate(labels)}

    tf.set_seed(args.seed)  # run_glue seeds before building the model, so the new head's weights follow the seed
    tok = tf.AutoTokenizer.from_pretrained(args.model_dir)
    model = tf.AutoModelForSequenceClassification.from_pretrained(
        args.model_dir, num_labels=1 if regression else len(labels),
        **({} if regression else dict(id2label=dict(enumerate(labels)), label2id=label2id)))
    collator = tf.default_data_collator if args.padding == "max" else tf.DataCollatorWithPadding(tok)
    targs = training_args(tf, args, RECIPE)
    trainer = tf.Trainer(model=model, args=targs, train_dataset=encode(tok, train_ex, label2id, args.padding),
                         data_collator=collator)
    trainer.train()
    trained = training_done()

    start = time.perf_counter()
    out = trainer.predict(encode(tok, report_ex, label2id, args.padding))
    logits = out.predictions[0] if isinstance(out.predictions, tuple) else out.predictions
    if regression:
        predictions = [round(float(v), 4) for v in np.asarray(logits).reshape(-1)]
    else:
        predictions = [labels[i] for i in np.argmax(logits, -1).tolist()]
    metrics = task.score(report_ex, predictions)
    write_result(args, trainer, metrics, trained, start, len(train_ex), len(report_ex), args.padding, RECIPE)


def token_classification(args, task, train_ex: list[dict], report_ex: list[dict]) -> None:
    """run_ner's side: AutoModelForTokenClassification with NER_RECIPE, scored by attnlab's entity F1."""
    import transformers as tf
    labels = sorted({t for ex in train_ex for t in ex["tags"]})
    label2id = {name: i for i, name in enumerate(labels)}
    tf.set_seed(args.seed)
    tok = tf.AutoTokenizer.from_pretrained(args.model_dir)
    model = tf.AutoModelForTokenClassification.from_pretrained(
        args.model_dir, num_labels=len(labels), id2label=dict(enumerate(labels)), label2id=label2id)
    targs = training_args(tf, args, NER_RECIPE)
    trainer = tf.Trainer(model=model, args=targs,
                         train_dataset=encode_words(pieces(tok, train_ex), train_ex, label2id),
                         data_collator=tf.DataCollatorForTokenClassification(tok))
    trainer.train()
    trained = training_done()
    start = time.perf_counter()
    report = pieces(tok, report_ex)  # tokenized once: the inputs, then which piece is each word's first
    out = trainer.predict(encode_words(report, report_ex, label2id))
    metrics = task.score(report_ex, word_tags(report, report_ex, out.predictions, labels))
    write_result(args, trainer, metrics, trained, start, len(train_ex), len(report_ex), "dynamic", NER_RECIPE)


if __name__ == "__main__":
    main()
