"""DPO toy run (issue #25): teach SmolLM2-135M-Instruct to continue movie-review openings positively.

1. Prompts: the first 4 words of SST-2's 872 clean held-out sentences (research/lora/sst2_lora_vs_full.sh
   writes them); training prompts and evaluation prompts are disjoint.
2. Pairs: two sampled continuations per training prompt (temperature 1, top-p 0.95, 20 tokens); the judge,
   a MiniLM fine-tuned on SST-2, scores "prompt + continuation"; the more positive one is chosen.
3. DPO with LoRA (r=8 on q, v; the reference is the base model under the adapter), beta 0.1.
4. Positive rate (judge's P(positive) > 0.5) of sampled continuations on the evaluation prompts, before
   and after, with the same sampling seeds.

    OMP_NUM_THREADS=1 python research/lora/dpo_sentiment.py --judge /tmp/lora_exp/full \
        --prompts /tmp/lora_exp/heldout-872.tsv --out /tmp/lora_dpo
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

import attnlab
from attnlab.inference.generate import encode_prompts, generate
from attnlab.nn.lora import merge_lora
from attnlab.training.dpo import dpo


def continuations(model, tok, prompts: list[str], seed: int, batch: int = 32) -> list[str]:
    out = []
    for k in range(0, len(prompts), batch):
        ids, mask = encode_prompts(tok, prompts[k:k + batch])
        with torch.no_grad():
            full = generate(model, ids, mask, max_new_tokens=20, temperature=1.0, top_p=0.95, seed=seed + k,
                            stop_strings=["\n"], tokenizer=tok)
        for row in full[:, ids.size(1):].tolist():
            row = [t for t in row if t != tok.pad_token_id]
            out.append(tok.decode(row).split("\n")[0])
    return out


def positive(judge, jtok, texts: list[str]) -> list[float]:
    probs = []
    for k in range(0, len(texts), 64):
        enc = jtok(texts[k:k + 64], padding=True, truncation=True, max_length=64, return_tensors="pt")
        with torch.no_grad():
            logits = judge(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                           token_type_ids=enc.get("token_type_ids")).logits
        probs += logits.softmax(-1)[:, judge.config.extra["label2id"]["1"]].tolist()
    return probs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--judge", required=True, help="a MiniLM fine-tuned on SST-2 (attnlab finetune sst2 output)")
    ap.add_argument("--prompts", required=True, help="SST-2-format tsv whose sentences' openings are the prompts")
    ap.add_argument("--out", default="/tmp/lora_dpo")
    ap.add_argument("--train-prompts", type=int, default=96)
    ap.add_argument("--eval-prompts", type=int, default=100)
    ap.add_argument("--epochs", type=float, default=2.0)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--beta", type=float, default=0.1)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = Path(a.prompts).read_text(encoding="utf-8").splitlines()[1:]
    openings = [" ".join(line.split("\t")[0].split()[:4]) for line in lines if len(line.split("\t")[0].split()) > 6]
    train_p = openings[:a.train_prompts]
    eval_p = openings[-a.eval_prompts:]
    judge, jtok = attnlab.load(a.judge).eval(), attnlab.load_tokenizer(a.judge)
    model, tok = attnlab.load("smollm2").eval(), attnlab.load_tokenizer("smollm2")
    report = {"load_start": open("/proc/loadavg").read().split()[:3], "train_prompts": len(train_p),
              "eval_prompts": len(eval_p)}
    t0 = time.time()
    before = continuations(model, tok, eval_p, seed=1000)
    p_before = positive(judge, jtok, [p + c for p, c in zip(eval_p, before)])
    report["eval_sampling_s"] = round(time.time() - t0, 1)

    t0 = time.time()
    a_s, b_s = continuations(model, tok, train_p, seed=1), continuations(model, tok, train_p, seed=2)
    pa, pb = positive(judge, jtok, [p + c for p, c in zip(train_p, a_s)]), positive(judge, jtok, [p + c for p, c in zip(train_p, b_s)])
    prefs = [{"prompt": p, "chosen": x if px >= py else y, "rejected": y if px >= py else x}
             for p, x, y, px, py in zip(train_p, a_s, b_s, pa, pb) if x.strip() and y.strip() and x != y]
    (out / "prefs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in prefs))
    report["pairs"] = len(prefs)
    report["pair_building_s"] = round(time.time() - t0, 1)
    report["chosen_mean_p_positive"] = round(sum(max(x, y) for x, y in zip(pa, pb)) / len(pa), 3)
    report["rejected_mean_p_positive"] = round(sum(min(x, y) for x, y in zip(pa, pb)) / len(pa), 3)

    summary = dpo("smollm2", out / "prefs.jsonl", out / "adapter", lora={"r": 8, "alpha": 16.0}, beta=a.beta,
                  batch_size=8, epochs=a.epochs, lr=a.lr, progress=False, model=model, tokenizer=tok)
    report["dpo"] = summary
    merge_lora(model, unload=True)
    model.eval()
    t0 = time.time()
    after = continuations(model, tok, eval_p, seed=1000)
    p_after = positive(judge, jtok, [p + c for p, c in zip(eval_p, after)])
    report["positive_rate_before"] = round(sum(p > 0.5 for p in p_before) / len(p_before), 3)
    report["positive_rate_after"] = round(sum(p > 0.5 for p in p_after) / len(p_after), 3)
    report["mean_p_positive_before"] = round(sum(p_before) / len(p_before), 3)
    report["mean_p_positive_after"] = round(sum(p_after) / len(p_after), 3)
    report["examples"] = [{"prompt": p, "before": b, "after": c} for p, b, c in list(zip(eval_p, before, after))[:8]]
    report["load_end"] = open("/proc/loadavg").read().split()[:3]
    report["omp_num_threads"] = os.environ.get("OMP_NUM_THREADS")
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
