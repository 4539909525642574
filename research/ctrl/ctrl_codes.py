"""CTRL's control codes, measured (Keskar et al. 2019, §2.1: "control codes ... at the beginning of a
sequence"): a character-level CTRL (the `ctrl` preset's architecture, shrunk) trained on Gutenberg books with
one control-code token per book prepended to every training window. Then, on held-out text of each book (its
last 10%, never trained on):

  * loss (bits per character) with the book's own code vs with each wrong code: the code carries information
    about the text only if the right one gives the lower loss;
  * which code explains a held-out window best (argmin loss over codes): accuracy vs chance 1/K;
  * samples steered only by the code (the same empty prompt, a different first token).

    OMP_NUM_THREADS=1 python research/ctrl/ctrl_codes.py --minutes 8 --out runs/ctrl_codes.json

Prints the numbers as one JSON document (also written to --out) with the command and the load average.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import attnlab
from attnlab.config import preset
from attnlab.inference.generate import generate

BOOKS = {"emma": "158-0.txt", "moby_dick": "2701-0.txt", "huck_finn": "76-0.txt", "dracula": "pg345.txt",
         "treasure_island": "pg120.txt", "two_cities": "98-0.txt"}


def book_text(path: Path) -> str:
    """The book without Project Gutenberg's licence header and footer."""
    text = path.read_text(encoding="utf-8-sig")
    start, end = text.find("*** START OF"), text.find("*** END OF")
    if start >= 0:
        text = text[text.index("\n", start) + 1:]
        end = text.find("*** END OF")
    return " ".join(text[: end if end >= 0 else None].split())  # one space for every run of whitespace


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=8.0, help="training time budget")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--eval-windows", type=int, default=60, help="held-out windows per book")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    root = Path(os.environ.get("ATTNLAB_DATA", "/work/shared/data")) / "gutenberg"
    texts = {name: book_text(root / f) for name, f in BOOKS.items()}
    chars = sorted({c for t in texts.values() for c in t})
    stoi = {c: i for i, c in enumerate(chars)}
    codes = {name: len(chars) + k for k, name in enumerate(BOOKS)}  # one extra token per book
    data = {name: torch.tensor([stoi[c] for c in t]) for name, t in texts.items()}
    split = {name: int(len(d) * 0.9) for name, d in data.items()}  # the last 10% is held out
    t = args.seq_len
    cfg = preset("ctrl", vocab_size=len(chars) + len(codes), hidden_size=128, num_layers=4, num_heads=4,
                 intermediate_size=512, max_position_embeddings=t + 1, dropout=0.0)
    model = attnlab.from_config(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01, betas=(0.9, 0.98))
    names = list(BOOKS)

    def window(name: str, lo: int, hi: int) -> torch.Tensor:
        s = rng.randrange(lo, hi - t)
        return data[name][s:s + t]

    def batch_with(name_list, code_of, spans):
        rows = [torch.cat([torch.tensor([codes[code_of(n)]]), w]) for n, w in zip(name_list, spans)]
        ids = torch.stack(rows)
        labels = ids.clone()
        labels[:, 0] = -100  # the code is given, never predicted
        return ids, labels

    started, step, losses = time.time(), 0, []
    model.train()
    while time.time() - started < args.minutes * 60:
        lr = 2e-3 * min(1.0, (step + 1) / 200)
        for g in opt.param_groups:
            g["lr"] = lr
        picked = [rng.choice(names) for _ in range(args.batch)]
        ids, labels = batch_with(picked, lambda n: n, [window(n, 0, split[n]) for n in picked])
        loss = model(ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        step += 1
        if step % 200 == 0:
            print(f"step {step}  loss {sum(losses[-200:]) / 200:.3f}  {time.time() - started:.0f}s", file=sys.stderr)
    train_seconds = time.time() - started

    # held-out: the same windows scored under every code
    model.eval()
    bpc = {true: {} for true in names}  # bpc[true book][code used]
    correct = 0
    with torch.no_grad():
        for true in names:
            spans = [window(true, split[true], len(data[true])) for _ in range(args.eval_windows)]
            per_code = []
            for code in names:
                ids, labels = batch_with([true] * len(spans), lambda n: code, spans)
                logits = model(ids).logits[:, :-1]
                nll = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none").mean(1)  # per window
                per_code.append(nll)
                bpc[true][code] = nll.mean().item() / math.log(2)
            correct += (torch.stack(per_code).argmin(0) == names.index(true)).sum().item()
    right = sum(bpc[n][n] for n in names) / len(names)
    wrong = sum(bpc[n][c] for n in names for c in names if c != n) / (len(names) * (len(names) - 1))
    samples = {}
    for name in names:
        out = generate(model, torch.tensor([[codes[name]]]), max_new_tokens=t, temperature=0.8, top_k=20, seed=1,
                       eos_token_id=[])
        samples[name] = "".join(chars[i] for i in out[0, 1:].tolist())
    result = dict(
        books=BOOKS, params=model.num_parameters(), steps=step, train_seconds=round(train_seconds),
        final_train_loss=round(sum(losses[-200:]) / min(200, len(losses)), 4),
        heldout_bpc_right_code=round(right, 4), heldout_bpc_wrong_code=round(wrong, 4),
        bpc_matrix={n: {c: round(v, 4) for c, v in row.items()} for n, row in bpc.items()},
        code_identification_accuracy=round(correct / (len(names) * args.eval_windows), 4),
        chance=round(1 / len(names), 4), samples=samples,
        command="OMP_NUM_THREADS=1 python " + " ".join(sys.argv), loadavg=open("/proc/loadavg").read().strip())
    text = json.dumps(result, indent=2, ensure_ascii=False)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
