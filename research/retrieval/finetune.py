"""A short contrastive fine-tune of MiniLM on SQuAD train question -> paragraph pairs (InfoNCE, in-batch
negatives drawn from one article per batch; attnlab.tasks.retrieval.contrastive_finetune), scoring as the chosen kind does, with every paragraph
of the evaluation file left out. Bounded by CPU minutes. Writes the model + tokenizer and history.jsonl.

usage: python research/retrieval/finetune.py --kind dense --output /work/runs/retrieval/ft-dense \
           [--cpu-minutes 7] [--steps 90] [--batch-size 32] [--lr 3e-5]
then:  research/retrieval/measure.sh /work/runs/retrieval/ft-dense ft-dense
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import time
from pathlib import Path

import attnlab
from attnlab.tasks.retrieval import contrastive_finetune, squad_pairs, squad_pairs_by_article

DATA = Path(os.environ.get("ATTNLAB_DATA", "../shared/data"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="minilm")
    p.add_argument("--kind", choices=("dense", "colbert"), default="dense")
    p.add_argument("--output", required=True, type=Path)
    p.add_argument("--eval", type=Path, default=DATA / "squad" / "dev.json", help="paragraphs kept out of training")
    p.add_argument("--cpu-minutes", type=float, default=7.0)
    p.add_argument("--steps", type=int, default=90, help="schedule length (linear warm-up 10%%, linear decay)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mixed-batches", action="store_true",
                   help="draw a batch from all articles (default: from one article, same-topic negatives)")
    args = p.parse_args()
    train = sorted(glob.glob(str(DATA / "squad" / "train*.json")))
    paragraphs, questions, gold, articles = squad_pairs_by_article(train)
    held_out = set(squad_pairs(args.eval)[0])
    model = attnlab.load(args.model)
    tokenizer = attnlab.load_tokenizer(args.model)
    args.output.mkdir(parents=True, exist_ok=True)
    t0, c0 = time.perf_counter(), time.process_time()
    with open(args.output / "history.jsonl", "w") as log:
        def note(record):
            log.write(json.dumps(record) + "\n")
            log.flush()
            if record["step"] % 10 == 0 or record["step"] == 1:
                print(record, flush=True)
        run = contrastive_finetune(model, tokenizer, paragraphs, questions, gold, args.kind, exclude=held_out,
                                   batch_size=args.batch_size, lr=args.lr, steps=args.steps,
                                   max_cpu_minutes=args.cpu_minutes, seed=args.seed, log=note,
                                   groups=None if args.mixed_batches else articles)
    attnlab.save(model, args.output)
    tokenizer.save(args.output)
    summary = {k: v for k, v in run.items() if k != "steps"}
    summary.update(steps_done=len(run["steps"]), first=run["steps"][0], last=run["steps"][-1],
                   train_files=len(train), held_out_paragraphs=len(held_out),
                   cpu_s=round(time.process_time() - c0, 1), wall_s=round(time.perf_counter() - t0, 1), **vars(args))
    (args.output / "summary.json").write_text(json.dumps(summary, default=str, indent=1) + "\n")
    print(json.dumps(summary, default=str))


if __name__ == "__main__":
    main()
