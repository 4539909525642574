"""`attnlab dpo`: preference-tune a decoder with DPO (objectives/dpo.py), with LoRA or fully.

Data is JSONL, one preference per line: {"prompt": ..., "chosen": ..., "rejected": ...}. The answers are
scored as a chat turn of the model's template (`chat=True`) or as plain continuations of the prompt.
With LoRA the reference policy is the base model under the adapters (no second copy); without, a frozen
copy of the starting model. The result goes to OUTPUT as with `attnlab sft`: the adapter (peft layout)
or the whole model with its tokenizer, and metrics.json.
"""
from __future__ import annotations

import copy
import math
import random
import sys
import time
from pathlib import Path

import torch

from ..interop.api import load, load_tokenizer
from ..interop.peft import lora_for_training
from ..objectives.dpo import answer_example, dpo_batch_loss, dpo_metrics, preference_batch
from .sft import pad_id_of, read_jsonl, save_tuned
from .args import TrainArgs
from .trainer import Trainer


def read_preferences(path: str | Path) -> list[dict]:
    out = []
    for n, row in read_jsonl(path, "preferences"):
        if not (isinstance(row, dict) and all(isinstance(row.get(k), str) for k in ("prompt", "chosen", "rejected"))):
            raise ValueError(f"{path}:{n}: expected {{\"prompt\": ..., \"chosen\": ..., \"rejected\": ...}} (strings)")
        out.append(row)
    return out


def dpo(model_name: str | Path, data: str | Path, output: str | Path, *, lora: dict | None = None,
        beta: float = 0.1, chat: bool = False, batch_size: int = 8, epochs: float = 1.0,
        max_steps: int | None = None, lr: float | None = None, seed: int = 0, progress: bool = True,
        model=None, tokenizer=None) -> dict:
    """lr defaults to 1e-4 with LoRA, 1e-6 for full fine-tuning (the paper's). `model`/`tokenizer` may be
    passed already loaded (then `model_name` only labels the run)."""
    if beta <= 0:
        raise ValueError(f"dpo: beta={beta} must be positive")
    started = time.time()
    torch.manual_seed(seed)
    model = model if model is not None else load(model_name)
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(model_name)
    if not model.config.causal or not hasattr(model, "lm_head"):
        raise ValueError(f"{model_name}: dpo needs a causal LM, got {model.hf_architecture or type(model).__name__}")
    prefs = read_preferences(data)
    pairs = [(answer_example(tokenizer, p["prompt"], p["chosen"], chat),
              answer_example(tokenizer, p["prompt"], p["rejected"], chat)) for p in prefs]
    pad_id = pad_id_of(tokenizer)
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    batches = [preference_batch([pairs[i] for i in order[k:k + batch_size]], pad_id)
               for k in range(0, len(order), batch_size)]
    reference = None
    if lora:
        trainable = lora_for_training(model, **lora)
    else:
        reference = copy.deepcopy(model).eval()
        for p in reference.parameters():
            p.requires_grad_(False)
        trainable = sum(p.numel() for p in model.parameters())
    lr = lr if lr is not None else (1e-4 if lora else 1e-6)
    steps = max_steps or max(1, math.ceil(epochs * len(batches)))
    print(f"dpo: {len(pairs)} preferences, {steps} steps of {batch_size} pairs, beta {beta}, lr {lr:g}, "
          f"{trainable:,} parameters train", file=sys.stderr, flush=True)
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    args = TrainArgs(output_dir=str(output), max_steps=steps, lr=lr, warmup_steps=max(0, steps // 10),
                     schedule="linear", weight_decay=0.0, clip_norm=1.0, seed=seed, keep_last=0,
                     log_every=max(1, min(5, steps)), progress=progress)
    model.train()
    trainer = Trainer(model, args, batches, eval_data=batches,
                      loss_fn=lambda m, b: dpo_batch_loss(m, b, beta, reference), metrics_fn=dpo_metrics)
    metrics = trainer.train() or {}
    model.eval()
    summary = {"model": str(model_name), "data": str(data), "preferences": len(pairs), "steps": steps, "lr": lr,
               "beta": beta, "chat": chat, "batch_size": batch_size, "seed": seed, "trainable_parameters": trainable,
               **({"lora": lora} if lora else {}), "wall_time_s": round(time.time() - started, 1),
               **{f"train_{k.removeprefix('eval_')}": round(v, 4) for k, v in metrics.items() if isinstance(v, float)}}
    save_tuned(model, tokenizer, output, lora, model_name, summary)
    return summary
