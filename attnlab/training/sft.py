"""`attnlab sft`: instruction-tune a decoder on conversations (JSONL), fully or with LoRA.

The objective (assistant-only labels, packing with a document mask) lives in objectives/sft.py; this
is the run: read conversations, pack them into rows of `seq_len` tokens, train with the shared Trainer,
and write the result — the adapter in peft's layout with LoRA (`attnlab generate MODEL --adapter OUT`),
else the whole model with its tokenizer — plus metrics.json.

A data file holds one conversation per line: {"messages": [{"role": "user", "content": ...},
{"role": "assistant", "content": ...}, ...]}, or the short form {"prompt": ..., "completion": ...}.
"""
from __future__ import annotations

import json
import math
import random
import sys
import time
from pathlib import Path

import torch

from ..interop.api import load, load_tokenizer
from ..interop.files import atomic_write
from ..interop.native import save_model
from ..interop.peft import lora_for_training, save_adapter
from ..objectives.sft import chat_example, collate_packed, pack, sft_loss
from .args import TrainArgs
from .trainer import Trainer


def read_jsonl(path: str | Path, what: str) -> list[tuple[int, object]]:
    """(line number, parsed row) of a JSONL file; a bad line is an error naming the file and the line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not found")
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                rows.append((n, json.loads(line)))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{n}: not valid JSON ({err.msg})") from None
    if not rows:
        raise ValueError(f"{path}: no {what}")
    return rows


def read_conversations(path: str | Path) -> list[list[dict]]:
    """Conversations of a JSONL file ({"messages": [...]} or {"prompt", "completion"} per line)."""
    out = []
    for n, row in read_jsonl(path, "conversations"):
        if isinstance(row, dict) and isinstance(row.get("messages"), list):
            messages = row["messages"]
        elif isinstance(row, dict) and isinstance(row.get("prompt"), str) and isinstance(row.get("completion"), str):
            messages = [{"role": "user", "content": row["prompt"]}, {"role": "assistant", "content": row["completion"]}]
        else:
            raise ValueError(f"{path}:{n}: expected {{\"messages\": [...]}} or {{\"prompt\": ..., \"completion\": ...}}")
        if not all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                   for m in messages):
            raise ValueError(f"{path}:{n}: every message needs a string 'role' and 'content'")
        out.append(messages)
    return out


def pad_id_of(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)


def save_tuned(model, tokenizer, output: Path, lora: dict | None, model_name, summary: dict) -> None:
    """The adapter (peft layout) with LoRA, else the whole model and its tokenizer; then metrics.json."""
    if lora:
        save_adapter(model, output, base_model_name_or_path=str(model_name))
    else:
        save_model(model, output)
        tokenizer.save(output)
    atomic_write(output / "metrics.json", lambda tmp: Path(tmp).write_text(json.dumps(summary, indent=2) + "\n"))


def packed_batches(examples: list[dict], seq_len: int, batch_size: int, pad_id: int, seed: int) -> list[dict]:
    rows = pack(examples, seq_len)
    random.Random(seed).shuffle(rows)
    return [collate_packed([[examples[i] for i in r] for r in rows[k:k + batch_size]], seq_len, pad_id)
            for k in range(0, len(rows), batch_size)]


def sft_metrics(sums: dict[str, float]) -> dict[str, float]:
    loss = sums["loss_sum"] / max(sums["n"], 1)
    return {"loss": loss, "perplexity": math.exp(min(loss, 50.0))}


def sft(model_name: str | Path, data: str | Path, output: str | Path, *, valid: str | Path | None = None,
        lora: dict | None = None, seq_len: int = 512, batch_size: int = 8, epochs: float = 1.0,
        max_steps: int | None = None, lr: float | None = None, warmup_ratio: float = 0.05, seed: int = 0,
        progress: bool = True, log_every: int = 10, model=None, tokenizer=None) -> dict:
    """Instruction-tune `model_name` (a causal LM: HF directory, .gguf or packaged name) on `data`.
    lr defaults to 2e-4 with LoRA, 2e-5 for full fine-tuning. `model`/`tokenizer` may be passed already
    loaded (then `model_name` only labels the run)."""
    started = time.time()
    torch.manual_seed(seed)
    model = model if model is not None else load(model_name)
    if not model.config.causal or not hasattr(model, "lm_head"):
        raise ValueError(f"{model_name}: sft needs a causal LM, got {model.hf_architecture or type(model).__name__}")
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(model_name)
    pad_id = pad_id_of(tokenizer)
    train_ex = [chat_example(tokenizer, c) for c in read_conversations(data)]
    valid_ex = [chat_example(tokenizer, c) for c in read_conversations(valid)] if valid else []
    model.train()
    total_params = model.num_parameters()
    trainable = lora_for_training(model, **lora) if lora else sum(p.numel() for p in model.parameters())
    lr = lr if lr is not None else (2e-4 if lora else 2e-5)
    batches = packed_batches(train_ex, seq_len, batch_size, pad_id, seed)
    steps = max_steps or max(1, math.ceil(epochs * len(batches)))
    print(f"sft: {len(train_ex)} conversations in {len(batches)} batches of <= {batch_size} packed rows of "
          f"{seq_len} tokens; {steps} steps at lr {lr:g}; {trainable:,} of {total_params:,} parameters train"
          + (f" (LoRA {lora})" if lora else ""), file=sys.stderr, flush=True)
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    args = TrainArgs(output_dir=str(output), max_steps=steps, lr=lr, warmup_steps=int(steps * warmup_ratio),
                     schedule="cosine", weight_decay=0.0, clip_norm=1.0, seed=seed, keep_last=0,
                     log_every=max(1, min(log_every, steps)), progress=progress)
    evals = packed_batches(valid_ex, seq_len, batch_size, pad_id, seed) if valid_ex else None
    trainer = Trainer(model, args, batches, loss_fn=sft_loss, eval_data=evals, metrics_fn=sft_metrics)
    metrics = trainer.train() or {}
    model.eval()
    summary = {"model": str(model_name), "data": str(data), "conversations": len(train_ex),
               "trained_tokens_per_epoch": sum(sum(1 for l in e["labels"] if l != -100) for e in train_ex),
               "steps": steps, "lr": lr, "seq_len": seq_len, "batch_size": batch_size, "seed": seed,
               "trainable_parameters": trainable, "parameters": total_params,
               **({"lora": lora} if lora else {}), "wall_time_s": round(time.time() - started, 1),
               **{k: round(v, 4) for k, v in metrics.items() if isinstance(v, float)}}
    save_tuned(model, tokenizer, output, lora, model_name, summary)
    return summary
