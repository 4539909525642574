"""Greedy output of attnlab on a GGUF file's quantized blocks vs on the same file dequantized to fp32:
the first --new-tokens tokens of 20 chat prompts, token by token; where they differ, the step and the
fp32 path's top-2 logit margin there (how near a tie the rounding flipped).

    .venv/bin/python benchmarks/gguf_greedy_equal.py [--model smollm2] [--new-tokens 32] [--exact]

The prompt and the LM head compute in fp32 from the same block values on both sides (summation order
apart: ~1e-6 relative). The batch-1 decode step by default quantizes each activation row to int8 per block
of 32 for integer dot products where the CPU has AVX512-VNNI, as llama.cpp does (~0.5% relative error per
product): near-ties can flip there. --exact decodes with fp32 activations (`generate --exact`).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import attnlab  # noqa: E402
from attnlab.inference.chat import apply_chat_template  # noqa: E402
from attnlab.inference.generate import encode_prompts, generate  # noqa: E402

PROMPTS = [
    "What is the capital of France?", "Write a haiku about the sea.", "Explain photosynthesis in one sentence.",
    "What is 17 times 23?", "Name three primary colors.", "Who wrote Romeo and Juliet?",
    "Give me a tip for learning Python.", "What is the boiling point of water in Fahrenheit?",
    "Translate 'good morning' into Spanish.", "Why is the sky blue?", "Tell me a short joke.",
    "What does a CPU do?", "List the planets of the solar system.", "How do I make a cup of tea?",
    "What is the largest mammal?", "Summarize the plot of Cinderella.", "What is machine learning?",
    "Suggest a name for a cat.", "How many days are in a leap year?", "What causes rain?",
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--exact", action="store_true", help="fp32 activations in the decode step too")
    args = p.parse_args()
    if args.exact:
        from attnlab.nn.quantized import kernels
        kernels().ggml_exact(1)
    torch.set_num_threads(1)
    tok = attnlab.load_tokenizer(args.model)
    quant = attnlab.load(args.model, quantized=True)
    fp32 = attnlab.load(args.model)
    equal = 0
    for i, text in enumerate(PROMPTS):
        ids, _ = encode_prompts(tok, apply_chat_template(tok, [{"role": "user", "content": text}]))
        with torch.inference_mode():  # no EOS stop: always compare the full --new-tokens
            a = generate(quant, ids, max_new_tokens=args.new_tokens, eos_token_id=[])[0, ids.size(1):]
            b = generate(fp32, ids, max_new_tokens=args.new_tokens, eos_token_id=[])[0, ids.size(1):]
        if torch.equal(a, b):
            equal += 1
            print(f"{i + 1:2d} equal    {tok.decode(b)[:60]!r}")
            continue
        step = int((a != b).nonzero()[0])
        with torch.inference_mode():
            prefix = torch.cat([ids[0], b[:step]])[None]
            top = fp32(prefix, logits_to_keep=1).logits[0, -1].topk(2).values
        print(f"{i + 1:2d} DIFFERS at new token {step}: fp32 {int(b[step])} vs quantized {int(a[step])}; fp32 top-2 "
              f"margin there {float(top[0] - top[1]):.2e}")
    print(f"\n{equal}/{len(PROMPTS)} prompts: the first {args.new_tokens} greedy tokens are equal")


if __name__ == "__main__":
    main()
