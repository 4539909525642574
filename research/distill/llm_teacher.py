"""A bigger teacher for SST-2 (issue #28): fine-tune the packaged SmolLM2-135M-Instruct (6x MiniLM's
parameters, a decoder) as a sentiment classifier, then write its logits for every training sentence so that
a MiniLM student can learn from them (research/fewlabel/levers.py, lever "teacher_logits").

The classifier is the LM itself, read at the prompt's last position (prompt-based fine-tuning, Schick &
Schuetze 2021; Gao et al. 2021): "Review: {sentence}\\nSentiment:" and the next-token logits of
" negative" and " positive" are the two class logits. So training starts from the model's own zero-shot
guess (80.7% on the 872 held-out sentences) instead of a random head, and only two rows of the 49k-word
output projection are ever computed.

    OMP_NUM_THREADS=2 python research/distill/llm_teacher.py --train rest.tsv --held held.tsv \\
        --out runs/smol --epochs 1 --lr 2e-5

Writes OUT/teacher_logits.pt ({"sentences": [...], "logits": (N, 2) float tensor}, the training file's
order) and OUT/summary.json (held-out accuracy of the final weights, time). `--label FILE` also writes the
logits of another file's sentences (augmented copies from research/distill/augment.py: the teacher labels
what the student will see), `--save-model DIR` keeps the fine-tuned teacher.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import attnlab
from attnlab.nn.precision import resolve_precision, tune_malloc
# the classifier `finetune --teacher` trains
from attnlab.tasks.prompt_teacher import (PromptClassifier, class_logits, label_token_ids, prompt_batch,
                                          truncate_layers)
from attnlab.tasks.prompting import kshot_prompt  # the zero-shot prompt of `attnlab evaluate-prompting`


def read_tsv(path: str) -> list[tuple[str, int]]:
    rows = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines()[1:], start=2):
        text, _, label = line.rpartition("\t")
        if label.strip() not in ("0", "1"):
            raise SystemExit(f"{path}:{n}: expected 'sentence<TAB>0|1', got {line[:80]!r}")
        rows.append((text.strip(), int(label)))
    return rows


def batches(encoded: list[list[int]], order: list[int], size: int, pad: int):
    for k in range(0, len(order), size):
        idx = order[k:k + size]
        b = prompt_batch(encoded, idx, pad)
        yield idx, b["input_ids"], b["attention_mask"]


def length_buckets(encoded, size: int, rng: random.Random) -> list[int]:
    """Shuffled, then sorted by length within windows of 50 batches: little padding, still random."""
    order = list(range(len(encoded)))
    rng.shuffle(order)
    win = size * 50
    out = []
    for k in range(0, len(order), win):
        out += sorted(order[k:k + win], key=lambda i: len(encoded[i]))
    chunks = [out[k:k + size] for k in range(0, len(out), size)]
    rng.shuffle(chunks)
    return [i for c in chunks for i in c]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", required=True)
    ap.add_argument("--held", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--limit", type=int, default=0, help="train on the first N lines only (timing)")
    ap.add_argument("--eval-every", type=int, default=0)
    ap.add_argument("--freeze-layers", type=int, default=0,
                    help="freeze the embeddings and the bottom N layers (backward stops at layer N)")
    ap.add_argument("--keep-layers", type=int, default=0,
                    help="keep only the bottom N decoder layers (under the final norm and the label rows): a cheaper teacher")
    ap.add_argument("--layers", default="", help="keep only these decoder layers, e.g. 0-11,27-29 (0-based ranges)")
    ap.add_argument("--smoothing", type=float, default=0.0,
                    help="label smoothing of the teacher's cross-entropy (finetune's teacher uses 0.1: its logits "
                         "stay soft)")
    ap.add_argument("--precision", choices=["auto", "fp32", "bf16"], default="auto",
                    help="bf16 autocast, fp32, or auto (default): bf16 only where the CPU has it natively; on an "
                         "AVX2-only CPU bf16 is emulated and several times slower than fp32")
    ap.add_argument("--no-zero-shot", action="store_true", help="skip scoring the untrained prompt on --held")
    ap.add_argument("--save-model", metavar="DIR", help="also save the fine-tuned teacher (attnlab.save)")
    ap.add_argument("--label", metavar="TSV", action="append", default=[],
                    help="also write the teacher's logits for this file's sentences to OUT/<stem>_logits.pt "
                         "(e.g. augmented copies of the training sentences); repeatable")
    ap.add_argument("--no-train-logits", action="store_true",
                    help="skip the logits of the training file (when they were written by an identical run)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(a.seed)
    rng = random.Random(a.seed)

    lm = attnlab.load(a.model)
    tok = attnlab.load_tokenizer(a.model)
    label_ids = label_token_ids(tok, ["negative", "positive"], a.model)
    if a.keep_layers:
        truncate_layers(lm, a.keep_layers)  # what `finetune`'s teacher does (TEACHER_LAYERS)
    if a.layers:
        keep = [i for part in a.layers.split(",") for i in range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1)]
        lm.backbone.layers = torch.nn.ModuleList(lm.backbone.layers[i] for i in keep)
        lm.config.num_layers = len(keep)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    precision = resolve_precision(a.precision, "cpu")
    clf = PromptClassifier(lm, label_ids, a.freeze_layers)

    every, held = read_tsv(a.train), read_tsv(a.held)
    extra = {f: read_tsv(f) for f in a.label}  # read before training: a bad line stops the run early
    train = every[:a.limit] if a.limit else every
    enc = lambda rows: [tok.encode(kshot_prompt([], s), add_special_tokens=False) for s, _ in rows]
    tr_enc, held_enc = enc(train), enc(held)
    tr_y = torch.tensor([y for _, y in train])
    held_y = torch.tensor([y for _, y in held])

    def held_acc() -> float:
        return (class_logits(clf, held_enc, pad, precision).argmax(-1) == held_y).float().mean().item() * 100

    t0 = time.time()
    zero_shot = None if a.no_zero_shot else round(held_acc(), 2)
    print(json.dumps({"zero_shot_held": zero_shot, "s": round(time.time() - t0)}), flush=True)

    tune_malloc()  # as the Trainer does: the first steps were ~2.5x slower without it
    params = [p for p in clf.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
                            lr=a.lr)
    per_epoch = math.ceil(len(train) / a.batch_size)
    total = int(per_epoch * a.epochs)
    warm = max(1, int(0.06 * total))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warm, max(0.0, (total - s) / max(1, total - warm))))
    step, t0, seen_tok = 0, time.time(), 0
    log = open(out / "log.jsonl", "a")
    while step < total:
        for idx, ids, mask in batches(tr_enc, length_buckets(tr_enc, a.batch_size, rng), a.batch_size, pad):
            if step >= total:
                break
            clf.train()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                logits = clf(ids, mask)
            loss = F.cross_entropy(logits.float(), tr_y[idx], label_smoothing=a.smoothing)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            seen_tok += int(mask.sum())
            if step % 50 == 0 or step == total:
                row = {"step": step, "of": total, "loss": round(loss.item(), 4), "s": round(time.time() - t0),
                       "tok_s": round(seen_tok / (time.time() - t0))}
                if a.eval_every and (step % a.eval_every == 0 or step == total):
                    row["held"] = round(held_acc(), 2)
                print(json.dumps(row), flush=True)
                log.write(json.dumps(row) + "\n")
                log.flush()
    train_s = time.time() - t0
    final = held_acc()
    if a.save_model:
        attnlab.save(lm, a.save_model)
    t1 = time.time()
    summary = {"model": a.model, "train": a.train, "lines": len(train), "epochs": a.epochs, "lr": a.lr,
               "steps": total, "smoothing": a.smoothing, "precision": precision, "zero_shot_held": zero_shot,
               "final_held": round(final, 2),
               "train_s": round(train_s)}
    jobs = [] if a.no_train_logits else [("teacher_logits.pt", every, tr_enc if len(train) == len(every) else None)]
    jobs += [(Path(f).stem + "_logits.pt", rows, None) for f, rows in extra.items()]
    for name, rows, encoded in jobs:
        logits = class_logits(clf, encoded if encoded is not None else enc(rows), pad, precision)
        tmp = out / (name + ".tmp")
        torch.save({"sentences": [s for s, _ in rows], "logits": logits}, tmp)
        tmp.replace(out / name)
        summary[name] = {"lines": len(rows), "agree_with_labels": round((logits.argmax(-1) == torch.tensor(
            [y for _, y in rows])).float().mean().item() * 100, 2)}
    summary["logits_s"] = round(time.time() - t1)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
