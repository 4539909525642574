"""Preference-tune a decoder with DPO (Rafailov et al. 2023): no reward model, no RL; the loss raises
the likelihood of each chosen answer over its rejected one, relative to the frozen starting model.
--data is JSONL: {"prompt": "...", "chosen": "...", "rejected": "..."} a line. --chat scores the
answers as the assistant's turn of the chat template; by default they continue the prompt. With
--lora the reference is the base under the adapter, and the adapter goes to OUTPUT (peft's
layout).

examples:
  attnlab dpo smollm2 --data prefs.jsonl --output runs/smol-dpo --lora r=8,alpha=16 --beta 0.1
  attnlab generate smollm2 --adapter runs/smol-dpo --prompt "The movie was"

Guide: docs/guides/adapters-sft-dpo.md
"""
from __future__ import annotations

import argparse
import json

NAME = "dpo"
HELP = "preference-tune a decoder with DPO (optional LoRA)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="a causal LM directory, a .gguf file or a packaged name (smollm2)")
    p.add_argument("--data", required=True, help="preferences (JSONL with prompt, chosen, rejected)")
    p.add_argument("--output", required=True, help="directory for the adapter or model, and metrics.json")
    p.add_argument("--lora", metavar="r=8[,alpha=16,dropout=0.05,targets=q+v]", help="train a LoRA adapter")
    p.add_argument("--beta", type=float, default=0.1, help="strength of the pull towards the reference (default 0.1)")
    p.add_argument("--chat", action="store_true", help="answers are the assistant's turn of the chat template")
    p.add_argument("--batch-size", type=int, default=8, help="preference pairs per step (default 8)")
    p.add_argument("--epochs", type=float, default=1.0, help="passes over the data (default 1)")
    p.add_argument("--max-steps", type=int, help="optimizer steps (overrides --epochs)")
    p.add_argument("--lr", type=float, help="peak learning rate (default 1e-4 with --lora, else 1e-6)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from ..nn.lora import parse_lora_spec
    from ..training.dpo import dpo
    summary = dpo(args.model, args.data, args.output, lora=parse_lora_spec(args.lora) if args.lora else None,
                  beta=args.beta, chat=args.chat, batch_size=args.batch_size, epochs=args.epochs,
                  max_steps=args.max_steps, lr=args.lr, seed=args.seed, progress=args.progress)
    print(json.dumps(summary))
    return 0
