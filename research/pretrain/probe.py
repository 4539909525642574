"""A quick transfer proxy for pretraining ablations (seconds, not a fine-tune): a logistic-regression probe on
frozen mean-pooled features, trained on 1,000 whole SST-2 training sentences and scored on the 872 clean
held-out sentences (attnlab finetune's own `sentence_holdout`, seed 0; every phrase of them is left out of the
training pool, as in research/fewlabel/sst2_fewlabel.py).

    OMP_NUM_THREADS=1 python research/pretrain/probe.py runs/bert-cpu/model [more model dirs...]
    ... --random                 # also the same architecture from random init (seed 0): the baseline

Prints one JSON line per model: probe accuracy on the clean held-out part, feature seconds, load.
Mean pooling, because an MLM-only model has no trained [CLS]/pooler (Reimers & Gurevych 2019 pool by mean).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

import attnlab
from attnlab.tasks import get_task
from attnlab.tasks.base import data_root
from attnlab.tasks.splits import sentence_holdout

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "fewlabel"))
from sst2_fewlabel import sentences_of  # noqa: E402  the whole-sentence filter the few-label runs use


def sst2_probe_data(n: int = 1000, draw_seed: int = 0):
    task = get_task("sst2")
    rest, held = sentence_holdout(task.read(data_root() / task.train_file), 872, 0)
    train = random.Random(draw_seed).sample(sentences_of(rest), n)
    pick = lambda exs: ([e["texts"][0] for e in exs], np.array([int(e["label"]) for e in exs]))  # noqa: E731
    return pick(train), pick(held)


@torch.no_grad()
def mean_features(model, tok, texts: list[str], max_length: int = 64, batch: int = 64) -> np.ndarray:
    backbone = getattr(model, "backbone", model)
    backbone.eval()
    out = []
    for i in range(0, len(texts), batch):
        enc = tok(texts[i:i + batch], padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        hidden = backbone(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).last_hidden_state
        m = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        out.append(((hidden * m).sum(1) / m.sum(1)).float().numpy())
    return np.concatenate(out)


def probe(model, tok, data) -> float:
    (xtr, ytr), (xte, yte) = data
    ftr, fte = mean_features(model, tok, xtr), mean_features(model, tok, xte)
    scale = StandardScaler().fit(ftr)
    clf = LogisticRegression(max_iter=5000, C=0.1).fit(scale.transform(ftr), ytr)
    return float((clf.predict(scale.transform(fte)) == yte).mean() * 100)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--random", action="store_true", help="also score the first model's architecture from random init")
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--tokenizer", help="tokenizer directory, for checkpoints saved without one (default: the model's)")
    a = ap.parse_args()
    data = sst2_probe_data(a.n)
    runs = [(m, False) for m in a.models] + ([(a.models[0], True)] if a.random else [])
    for path, rand in runs:
        tok = attnlab.load_tokenizer(a.tokenizer or path)
        model = attnlab.load(path)
        if rand:
            torch.manual_seed(0)
            model = attnlab.from_config(model.config)
        t0 = time.time()
        acc = probe(model, tok, data)
        print(json.dumps({"model": path, "init": "random" if rand else "pretrained", "probe_accuracy": round(acc, 2),
                          "n_train": a.n, "seconds": round(time.time() - t0, 1),
                          "load": [round(x, 2) for x in os.getloadavg()]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
