"""Instruction-tune a decoder on conversations (supervised fine-tuning), fully or with LoRA. --data
is JSONL, one conversation a line: {"messages": [{"role": "user", "content": "..."}, {"role":
"assistant", "content": "..."}]} or {"prompt": "...", "completion": "..."}. The loss counts the
assistant's tokens only; short conversations are packed into rows of --seq-len tokens. With --lora
the adapter goes to OUTPUT in peft's layout (use it with --adapter OUTPUT), else the whole model.

examples:
  attnlab sft smollm2 --data chats.jsonl --output runs/smol-sft --lora r=8,alpha=16 --epochs 2
  attnlab generate smollm2 --adapter runs/smol-sft --chat --prompt "Classify: a dull film."

Guide: docs/guides/adapters-sft-dpo.md
"""
from __future__ import annotations

import argparse
import json

NAME = "sft"
HELP = "instruction-tune a decoder on chat data (optional LoRA)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="a causal LM directory, a .gguf file or a packaged name (smollm2)")
    p.add_argument("--data", required=True, help="training conversations (JSONL)")
    p.add_argument("--valid", help="validation conversations (JSONL): loss and perplexity on assistant tokens")
    p.add_argument("--output", required=True, help="directory for the adapter or model, and metrics.json")
    p.add_argument("--lora", metavar="r=8[,alpha=16,dropout=0.05,targets=q+v]",
                   help="train a LoRA adapter instead of every weight")
    p.add_argument("--seq-len", type=int, default=512, help="tokens per packed row (default 512)")
    p.add_argument("--batch-size", type=int, default=8, help="packed rows per step (default 8)")
    p.add_argument("--epochs", type=float, default=1.0, help="passes over the data (default 1)")
    p.add_argument("--max-steps", type=int, help="optimizer steps (overrides --epochs)")
    p.add_argument("--lr", type=float, help="peak learning rate (default 2e-4 with --lora, else 2e-5)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from ..nn.lora import parse_lora_spec
    from ..training.sft import sft
    if args.seq_len < 8 or args.batch_size < 1:
        raise ValueError("sft: --seq-len must be at least 8 and --batch-size at least 1")
    summary = sft(args.model, args.data, args.output, valid=args.valid,
                  lora=parse_lora_spec(args.lora) if args.lora else None, seq_len=args.seq_len,
                  batch_size=args.batch_size, epochs=args.epochs, max_steps=args.max_steps, lr=args.lr,
                  seed=args.seed, progress=args.progress)
    print(json.dumps(summary))
    return 0
