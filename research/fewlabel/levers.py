"""Training levers that `attnlab finetune` has no option for, tried in-process on one run (issue #21 Session 14):
the library's own `finetune` and `evaluate`, with one thing changed around them. None of them became an option
(research/fewlabel/RESULTS.md, Session 14, has why); this script is how the table was made.

    OMP_NUM_THREADS=1 python research/fewlabel/levers.py --train FL/sst2-train-1000-draw0.tsv \
        --held FL/sst2-clean-heldout-872.tsv --out /tmp/levers --lever '{"rdrop": 1.0}' [--kw '{"batch_size": 8}']

FL is a `sst2_fewlabel.py --out` directory (it writes the draws and the 872 clean sentences). Levers (JSON):
  ls     label smoothing of the cross-entropy (Szegedy et al. 2016), e.g. 0.1
  rdrop  R-Drop (Liang et al. 2021): two dropout passes, mean cross-entropy + alpha * symmetric KL between them
  drop   dropout of the encoder (hidden and attention probabilities), e.g. 0.0; hdrop: of the head only
  cos    a cosine classifier (Chen et al. 2019): scale * cos(sentence vector, class weight) + bias
  scl    supervised contrastive term (Gunel et al. 2021): (1 - scl) * CE + scl * SupCon on the normalised
         sentence vectors of the batch at temperature tau (default 0.3)
  kd     self-distillation (born-again networks, Furlanello et al. 2018): a fresh copy learns from the labels and
         a fine-tuned model's soft targets, (1 - kd) * CE + kd * T^2 * KL(teacher || student) at temperature T
         (default 2); "teacher": the fine-tuned model's directory, or a list of them (an ensemble: the target is
         the mean of their softened distributions, as in Hinton et al. 2015); or "teacher_logits": a .pt file of
         {"sentences", "logits"} written by another model (research/distill/llm_teacher.py: SmolLM2), or a
         list of them (the training file's and its augmented copies'), looked up by the student's token ids
--kw: keyword arguments of attnlab.tasks.finetune.finetune (batch_size, freeze_embeddings, epochs, ...).
Prints one JSON line, also appended to OUT/results.jsonl: accuracy of the kept model on --held, and the last
evaluation of the run (the final weights, when --kw gives valid_file=HELD)."""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import attnlab.tasks.finetune  # noqa: F401  (the module: the package re-exports its function by the same name)
import attnlab.training as training
from attnlab.objectives.distill import soft_target_loss

ft = sys.modules["attnlab.tasks.finetune"]


class CosineLinear(nn.Linear):
    scale = 20.0

    def forward(self, x):
        return self.scale * F.linear(F.normalize(x, dim=-1), F.normalize(self.weight, dim=-1)) + self.bias


def supcon(v: torch.Tensor, y: torch.Tensor, tau: float) -> torch.Tensor:
    """Mean over anchors with a positive of -log softmax over the batch's other vectors, averaged over positives."""
    z = F.normalize(v.float(), dim=-1)
    eye = torch.eye(len(y), dtype=torch.bool, device=z.device)
    logp = (z @ z.T / tau).masked_fill(eye, -1e9).log_softmax(-1)
    pos = (y[:, None] == y[None, :]) & ~eye
    has = pos.any(1)
    if not has.any():
        return v.sum() * 0
    return -(logp.masked_fill(~pos, 0).sum(1)[has] / pos.sum(1)[has]).mean()


def install(lev: dict) -> None:
    """Patch the library for the levers in `lev` (this process only)."""
    if lev.get("ls"):
        plain_ce = F.cross_entropy

        def smoothed(inp, tgt, *a, **k):
            if inp.dim() == 2:  # the sentence classifier's loss
                k.setdefault("label_smoothing", lev["ls"])
            return plain_ce(inp, tgt, *a, **k)
        F.cross_entropy = smoothed

    def patch(net):
        if lev.get("cos"):
            net.classifier.__class__ = CosineLinear  # same parameters, so the checkpoint saves and loads as a Linear
            CosineLinear.scale = float(lev["cos"])
        return net

    load, load_eval = ft.load_for_task, ft._load_for_eval

    def load_for_task(*a, **k):
        net = patch(load(*a, **k))
        if "drop" in lev:
            for m in net.backbone.modules():
                if isinstance(m, nn.Dropout):
                    m.p = lev["drop"]
                elif isinstance(getattr(m, "dropout", None), float):  # attention reads its rate as a float
                    m.dropout = lev["drop"]
        if "hdrop" in lev:
            net.dropout.p = lev["hdrop"]
        return net
    ft.load_for_task = load_for_task
    ft._load_for_eval = lambda *a, **k: (lambda r: (patch(r[0]), *r[1:]))(load_eval(*a, **k))
    sys.modules["attnlab.tasks.finetune_eval"].load_for_eval = ft._load_for_eval  # what evaluate() loads with

    loss = None
    if lev.get("rdrop"):
        def loss(model, batch):
            o1, o2 = model(**batch), model(**batch)
            p1, p2 = o1.logits.float().log_softmax(-1), o2.logits.float().log_softmax(-1)
            kl = 0.5 * (F.kl_div(p1, p2, log_target=True, reduction="batchmean")
                        + F.kl_div(p2, p1, log_target=True, reduction="batchmean"))
            return 0.5 * (o1.loss + o2.loss) + lev["rdrop"] * kl
    elif lev.get("scl"):
        def loss(model, batch):
            mask = batch.get("attention_mask")
            out = model._run_backbone(batch["input_ids"], mask, batch.get("token_type_ids"), None, None, False, False)
            v = model.sentence_vector(out, mask)
            ce = F.cross_entropy(model.classifier(model.dropout(v)).float(), batch["labels"])
            return (1 - lev["scl"]) * ce + lev["scl"] * supcon(v, batch["labels"], lev.get("tau", 0.3))
    elif lev.get("kd") and lev.get("teacher_logits"):
        files = lev["teacher_logits"] if isinstance(lev["teacher_logits"], list) else [lev["teacher_logits"]]
        saved = [torch.load(f) for f in files]  # e.g. the training file's and its augmented copies'
        from attnlab import load_tokenizer
        enc = load_tokenizer(lev.get("student_tokenizer", "minilm"))([s for d in saved for s in d["sentences"]],
                                                                      max_length=64, truncation=True)["input_ids"]
        table = {tuple(ids): row for ids, row in zip(enc, torch.cat([d["logits"].float() for d in saved]))}
        temp = float(lev.get("T", 2.0))

        def loss(model, batch):
            out = model(**batch)
            ids, mask = batch["input_ids"].tolist(), batch["attention_mask"].tolist()
            try:
                t = torch.stack([table[tuple(i for i, m in zip(r, mr) if m)] for r, mr in zip(ids, mask)])
            except KeyError as e:
                raise SystemExit(f"a training sentence has no teacher logits in {lev['teacher_logits']}") from e
            # fp32 targets: .to(out.logits) rounded them to a bf16 student's dtype (the kd students of Sessions 17-21)
            return (1 - lev["kd"]) * out.loss + lev["kd"] * soft_target_loss(out.logits, t.to(out.logits.device), temp)
    elif lev.get("kd"):
        dirs = lev["teacher"] if isinstance(lev["teacher"], list) else [lev["teacher"]]
        teachers = [ft._load_for_eval(ft.get_task("sst2"), d)[0].eval().requires_grad_(False) for d in dirs]
        temp = float(lev.get("T", 2.0))

        def loss(model, batch):
            out = model(**batch)
            with torch.no_grad():
                x = {k: v for k, v in batch.items() if k != "labels"}
                logp = torch.stack([(m(**x).logits.float() / temp).log_softmax(-1) for m in teachers])
                # log of the mean distribution, in log space (no log(0)); soft_target_loss divides by T again
                t = temp * (logp.logsumexp(0) - math.log(len(teachers)))
            return (1 - lev["kd"]) * out.loss + lev["kd"] * soft_target_loss(out.logits, t, temp)
    if loss is not None:
        base = training.Trainer

        class Trainer(base):
            def __init__(self, model, args, data, loss_fn=None, **k):
                super().__init__(model, args, data, loss_fn=loss_fn or loss, **k)
        training.Trainer = Trainer  # finetune imports it from the package at call time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", required=True)
    ap.add_argument("--held", required=True, help="the labelled file the kept model is scored on")
    ap.add_argument("--out", required=True)
    ap.add_argument("--lever", default="{}", help="JSON, see above")
    ap.add_argument("--kw", default="{}", help="JSON keyword arguments of finetune")
    ap.add_argument("--run", help="run directory name under --out (default: from the levers)")
    ap.add_argument("--model", default="minilm")
    a = ap.parse_args()
    lev, kw = json.loads(a.lever), json.loads(a.kw)
    install(lev)
    out = Path(a.out)
    name = a.run or "_".join(f"{k}{v}" for k, v in {**lev, **kw}.items() if k != "valid_file") or "defaults"
    run = out / f"{Path(a.train).stem}-{name}"
    t0, c0 = time.time(), time.process_time()
    summary = ft.finetune("sst2", a.model, run, train_file=a.train, progress=False, **kw)
    score = ft.evaluate("sst2", run, a.held)["accuracy"]
    evals = [json.loads(line) for line in open(run / "metrics.jsonl") if "eval_accuracy" in line]
    row = {"train": a.train, "lever": lev, "kw": kw, "kept_accuracy": score, "best_step": summary["best_step"],
           "steps": summary["steps"], "last_eval": evals[-1] if evals else None,
           "cpu_s": round(time.process_time() - c0), "wall_s": round(time.time() - t0)}
    print(json.dumps(row), flush=True)
    with open(out / "results.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
