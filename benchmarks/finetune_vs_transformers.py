"""Fine-tune all-MiniLM-L6-v2 on SST-2 with attnlab and with transformers' Trainer, side by side.

Both get the same fixed 10k-example training subset (seeded choice, disjoint from the 872 held-out
sentences that score them), 1 epoch, the same hyperparameters (AdamW lr 5e-5, weight decay 0.01,
10% linear warmup then linear decay, batch 32, max 64 tokens, gradient clipping 1.0, seed 42, word
embeddings frozen in both) and the same threads. What differs is each library's own loop: attnlab
batches by length (little padding); the Trainer uses its default shuffled sampler with padding to the
longest in a batch. Prints held-out accuracy and wall time for each, and the ratios.

    python benchmarks/finetune_vs_transformers.py [--subset 10000] [--threads N] [--precisions fp32,bf16]
Targets: accuracy within 0.5 points of transformers (or better), wall time <= 0.5x. attnlab runs once per
precision (`finetune --precision`; bf16 is autocast, fast only on a CPU with AVX512-BF16 or AMX); the
Trainer runs in fp32, its default on a CPU.
"""
from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import data_root, table  # noqa: E402

HP = dict(lr=5e-5, batch_size=32, max_length=64, epochs=1, weight_decay=0.01, warmup_ratio=0.1, seed=42)


def split(subset: int) -> tuple[list[dict], list[dict]]:
    from attnlab.tasks import get_task
    from attnlab.tasks.splits import holdout_split, validation_split
    task = get_task("sst2")
    examples = task.read(data_root() / "glue/SST-2/train.tsv")
    train, held, _ = validation_split(task, examples, 872)  # the same held-out set `attnlab finetune` uses
    train = holdout_split(train, subset, seed=HP["seed"])[1]
    return train, held


def write_tsv(examples: list[dict], path: Path) -> Path:
    path.write_text("sentence\tlabel\n" + "".join(f"{e['texts'][0]}\t{e['label']}\n" for e in examples))
    return path


def run_attnlab(train: list[dict], held: list[dict], work: Path, precision: str) -> tuple[float, float]:
    from attnlab.tasks import finetune
    start = time.perf_counter()
    summary = finetune("sst2", "minilm", work / f"attnlab-{precision}", precision=precision, train_file=write_tsv(train, work / "train.tsv"),
                       valid_file=write_tsv(held, work / "held.tsv"), epochs=HP["epochs"], lr=HP["lr"],
                       batch_size=HP["batch_size"], max_length=HP["max_length"], seed=HP["seed"],
                       warmup_ratio=HP["warmup_ratio"], weight_decay=HP["weight_decay"], progress=False)
    return summary["eval_accuracy"], time.perf_counter() - start


def run_transformers(train: list[dict], held: list[dict], work: Path) -> tuple[float, float]:
    import numpy as np
    import torch
    import transformers as tf
    from attnlab.interop.local import resolve

    start = time.perf_counter()
    model_dir = resolve("minilm")
    tok = tf.BertTokenizerFast.from_pretrained(model_dir)
    model = tf.BertForSequenceClassification.from_pretrained(model_dir, num_labels=2)
    model.bert.embeddings.word_embeddings.weight.requires_grad_(False)

    def encode(examples):
        enc = tok([e["texts"][0] for e in examples], truncation=True, max_length=HP["max_length"])
        return [{"input_ids": enc["input_ids"][i], "token_type_ids": enc["token_type_ids"][i],
                 "attention_mask": enc["attention_mask"][i], "labels": int(e["label"])}
                for i, e in enumerate(examples)]

    args = tf.TrainingArguments(
        output_dir=str(work / "hf"), per_device_train_batch_size=HP["batch_size"], per_device_eval_batch_size=64,
        learning_rate=HP["lr"], num_train_epochs=HP["epochs"], weight_decay=HP["weight_decay"],
        warmup_steps=HP["warmup_ratio"], lr_scheduler_type="linear", max_grad_norm=1.0, seed=HP["seed"],
        save_strategy="no", eval_strategy="no", report_to=[], use_cpu=True, logging_steps=50,
        dataloader_num_workers=0, disable_tqdm=True)
    trainer = tf.Trainer(model=model, args=args, train_dataset=encode(train),
                         data_collator=tf.DataCollatorWithPadding(tok))
    trainer.train()
    with torch.no_grad():
        out = trainer.predict(encode(held))
    accuracy = 100 * float((np.argmax(out.predictions, -1) == out.label_ids).mean())
    return accuracy, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--subset", type=int, default=10000, help="training examples (default 10000)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads for both (default: torch's)")
    ap.add_argument("--precisions", default="fp32", help="attnlab runs, comma-separated: fp32, bf16 (default fp32)")
    args = ap.parse_args()
    import torch
    if args.threads:
        torch.set_num_threads(args.threads)
    random.seed(HP["seed"])
    train, held = split(args.subset)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        ours = {p: run_attnlab(train, held, work, p) for p in args.precisions.split(",")}
        theirs = run_transformers(train, held, work)
    rows = [[f"attnlab {p}", f"{acc:.2f}", f"{wall:.0f}", f"{theirs[1] / wall:.2f}x"] for p, (acc, wall) in ours.items()]
    rows.append(["transformers Trainer fp32", f"{theirs[0]:.2f}", f"{theirs[1]:.0f}", "1.00x"])
    print(f"SST-2, {len(train)} training examples, 1 epoch, {len(held)} held-out, threads={torch.get_num_threads()}")
    print(table(rows, ["", "accuracy", "wall s", "speed vs transformers"]))


if __name__ == "__main__":
    main()
