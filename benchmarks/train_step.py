"""Training-step throughput of the character-GPT recipe: attnlab (eager, compiled, bf16, compiled + bf16)
vs a nanoGPT-shaped reference, same shape, data and optimizer, one process, the setups interleaved.

The recipe is nanoGPT's CPU one (configs/pretrain-gpt-shakespeare-char.yaml: 4 layers x 128, 4 heads,
context 64, batch 12, no biases, AdamW). The reference is written here after nanoGPT's model.py layout (a
fused qkv projection, `F.scaled_dot_product_attention(is_causal=True)`, GELU MLP, LayerNorm without bias,
tied embeddings; its CPU AdamW is the per-tensor one): the code nanoGPT users run, rebuilt so that the
benchmark needs nothing from the network. attnlab's setups use the Trainer's pieces: fused AdamW,
`train.compile` (torch.compile of the loss) and `train.precision=bf16` (autocast; pays only on CPUs with
AVX512-BF16 or AMX: see `lscpu`). Compile time is reported separately: it is paid once per process.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/train_step.py [--steps 30] [--repeats 5]
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from attnlab.config import ModelConfig  # noqa: E402
from attnlab.models.decoder import CausalLM  # noqa: E402
from attnlab.training.optim import param_groups  # noqa: E402

VOCAB, WIDTH, LAYERS, HEADS, CONTEXT, BATCH = 65, 128, 4, 4, 64, 12


class RefBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(WIDTH, bias=False), nn.LayerNorm(WIDTH, bias=False)
        self.c_attn, self.c_proj = nn.Linear(WIDTH, 3 * WIDTH, bias=False), nn.Linear(WIDTH, WIDTH, bias=False)
        self.c_fc, self.mlp_proj = nn.Linear(WIDTH, 4 * WIDTH, bias=False), nn.Linear(4 * WIDTH, WIDTH, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(WIDTH, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class RefGPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, WIDTH), nn.Embedding(CONTEXT, WIDTH)
        self.h = nn.ModuleList(RefBlock() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(WIDTH, bias=False)
        self.lm_head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight
        for p in self.parameters():
            nn.init.normal_(p, std=0.02) if p.dim() > 1 else None

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1)))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, VOCAB), targets.reshape(-1))


def attnlab_model() -> CausalLM:
    return CausalLM(ModelConfig(model_type="gpt2", causal=True, vocab_size=VOCAB, hidden_size=WIDTH,
                                num_layers=LAYERS, num_heads=HEADS, intermediate_size=4 * WIDTH,
                                max_position_embeddings=CONTEXT, norm_placement="pre", activation="gelu",
                                embedding_norm=False, final_norm=True, pooler=False, type_vocab_size=0, bias=False,
                                norm_eps=1e-5, dropout=0.0, attention_dropout=0.0))


def make_setup(name: str):
    """-> a function doing one optimizer step on a fresh batch, and the model it trains."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    if name == "nanoGPT-shaped reference":
        model = RefGPT()
        opt = torch.optim.AdamW(param_groups(model, 0.1), lr=1e-3, betas=(0.9, 0.99))
        loss_of = model
        autocast = contextlib.nullcontext
    else:
        model = attnlab_model()
        opt = torch.optim.AdamW(param_groups(model, 0.1), lr=1e-3, betas=(0.9, 0.99), fused=True)
        compiled = "compiled" in name
        forward = torch.compile(lambda i, t: model(input_ids=i, labels=t).loss) if compiled else \
            (lambda i, t: model(input_ids=i, labels=t).loss)
        loss_of = forward
        bf16 = "bf16" in name
        autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext

    def step() -> float:
        ids = torch.randint(0, VOCAB, (BATCH, CONTEXT + 1), generator=gen)
        with autocast():
            loss = loss_of(ids[:, :-1], ids[:, 1:]) if name == "nanoGPT-shaped reference" else \
                loss_of(ids[:, :-1], ids[:, :-1])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss)
    return step


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps per timed round")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per setup (best kept)")
    args = parser.parse_args()
    names = ["nanoGPT-shaped reference", "attnlab eager fp32", "attnlab compiled fp32", "attnlab eager bf16",
             "attnlab compiled bf16"]
    steps, warm = {}, {}
    for name in names:
        steps[name] = make_setup(name)
        started = time.perf_counter()
        steps[name]()
        steps[name]()  # the first steps compile (and warm the allocator)
        warm[name] = time.perf_counter() - started
    best = {name: math.inf for name in names}
    for r in range(args.repeats):
        for name in (names if r % 2 == 0 else names[::-1]):
            started = time.perf_counter()
            for _ in range(args.steps):
                steps[name]()
            best[name] = min(best[name], time.perf_counter() - started)
    tokens = args.steps * BATCH * CONTEXT
    ref = tokens / best[names[0]]
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    print(f"threads {torch.get_num_threads()}, avx512_bf16 {'yes' if 'avx512_bf16' in flags else 'no'}, "
          f"amx_bf16 {'yes' if 'amx_bf16' in flags else 'no'}, load {os.getloadavg()[0]:.2f}")
    print(f"{'setup':28} {'tokens/s':>10} {'vs reference':>13} {'first 2 steps (s)':>18}")
    for name in names:
        tps = tokens / best[name]
        print(f"{name:28} {tps:10,.0f} {tps / ref:12.2f}x {warm[name]:18.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
