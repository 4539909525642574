"""Instruction SFT of SmolLM2-135M-Instruct with LoRA on a small instruction set built from the data here
(issue #25): SST-2 sentiment ("Classify the sentiment ...: positive/negative") and Multi30k en->de
("Translate to German: ..."). Task accuracy and BLEU on held-out examples, before and after.

    OMP_NUM_THREADS=1 python research/lora/sft_smollm2.py --heldout /tmp/lora_exp/heldout-872.tsv \
        --train-sst2 /tmp/lora_exp/train-1000.tsv --out /tmp/lora_sft

Training sentences come from the 1,000-sentence SST-2 draw of sst2_lora_vs_full.sh, evaluation sentences
from the 872 clean held-out ones; translations from Multi30k's train (training) and val (evaluation).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

import attnlab
from attnlab.inference.chat import apply_chat_template
from attnlab.inference.generate import encode_prompts, generate
from attnlab.nn.lora import merge_lora
from attnlab.tasks.base import data_root
from attnlab.tasks.translation import bleu
from attnlab.training.sft import sft

SYSTEM = "Answer briefly."


def sentiment_prompt(s: str) -> str:
    return f"Classify the sentiment of this movie review as positive or negative.\nReview: {s}"


def translate_prompt(s: str) -> str:
    return f"Translate to German: {s}"


def tsv(path: Path) -> list[tuple[str, str]]:
    return [tuple(line.split("\t")[:2]) for line in path.read_text(encoding="utf-8").splitlines()[1:]]


def answers(model, tok, prompts: list[str], max_new: int, batch: int = 16) -> list[str]:
    texts = [apply_chat_template(tok, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": p}])
             for p in prompts]
    out = []
    for k in range(0, len(texts), batch):
        ids, mask = encode_prompts(tok, texts[k:k + batch])
        with torch.no_grad():
            full = generate(model, ids, mask, max_new_tokens=max_new, stop_strings=["<|im_end|>", "\n"], tokenizer=tok)
        out += [tok.decode([t for t in row if t != tok.pad_token_id]).split("\n")[0].strip()
                for row in full[:, ids.size(1):].tolist()]
    return out


def score(model, tok, sent_eval, tr_eval) -> dict:
    t0 = time.time()
    got = answers(model, tok, [sentiment_prompt(s) for s, _ in sent_eval], 3)
    words = [g.lower().strip(" .!") for g in got]
    acc = sum((w.startswith("pos") and y == "1") or (w.startswith("neg") and y == "0")
              for w, (_, y) in zip(words, sent_eval)) / len(sent_eval)
    valid = sum(w.startswith(("pos", "neg")) for w in words) / len(words)
    hyps = answers(model, tok, [translate_prompt(s) for s, _ in tr_eval], 40)
    return {"sentiment_accuracy": round(100 * acc, 1), "sentiment_answers_in_label_set": round(100 * valid, 1),
            **{f"translation_{k}": v for k, v in bleu(hyps, [r for _, r in tr_eval]).items() if k in ("bleu", "bp")},
            "eval_s": round(time.time() - t0, 1), "sentiment_examples": list(zip(got[:4], [y for _, y in sent_eval[:4]])),
            "translation_examples": list(zip(hyps[:3], [r for _, r in tr_eval[:3]]))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heldout", required=True)
    ap.add_argument("--train-sst2", required=True)
    ap.add_argument("--out", default="/tmp/lora_sft")
    ap.add_argument("--n-sentiment", type=int, default=96)
    ap.add_argument("--n-translation", type=int, default=48)
    ap.add_argument("--eval-sentiment", type=int, default=100)
    ap.add_argument("--eval-translation", type=int, default=50)
    ap.add_argument("--epochs", type=float, default=2.0)
    ap.add_argument("--lr", type=float, default=3e-4)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    mt = data_root() / "multi30k"
    en_tr, de_tr = (mt / "train.en").read_text().splitlines(), (mt / "train.de").read_text().splitlines()
    en_va, de_va = (mt / "val.en").read_text().splitlines(), (mt / "val.de").read_text().splitlines()
    short = [(e, d) for e, d in zip(en_tr, de_tr) if len(e.split()) <= 12][:a.n_translation]
    train_sent = tsv(Path(a.train_sst2))[:a.n_sentiment]
    label = {"1": "positive", "0": "negative"}
    rows = [{"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": sentiment_prompt(s)},
                          {"role": "assistant", "content": label[y]}]} for s, y in train_sent]
    rows += [{"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": translate_prompt(e)},
                           {"role": "assistant", "content": d}]} for e, d in short]
    (out / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    sent_eval = tsv(Path(a.heldout))[:a.eval_sentiment]
    tr_eval = list(zip(en_va, de_va))[:a.eval_translation]

    model, tok = attnlab.load("smollm2").eval(), attnlab.load_tokenizer("smollm2")
    report = {"load_start": open("/proc/loadavg").read().split()[:3], "train_examples": len(rows)}
    report["before"] = score(model, tok, sent_eval, tr_eval)
    report["sft"] = sft("smollm2", out / "train.jsonl", out / "adapter", lora={"r": 8, "alpha": 16.0,
                        "targets": ["q", "k", "v", "o", "gate", "up", "down"]}, seq_len=512, batch_size=2,
                        epochs=a.epochs, lr=a.lr, progress=False, model=model, tokenizer=tok)
    merge_lora(model, unload=True)
    model.eval()
    report["after"] = score(model, tok, sent_eval, tr_eval)
    report["load_end"] = open("/proc/loadavg").read().split()[:3]
    report["omp_num_threads"] = os.environ.get("OMP_NUM_THREADS")
    (out / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps(report, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
