"""One training step (forward + backward, batch 12 x 64) of the char MoE recipe vs its dense twin of equal
active parameters, interleaved in one process so that both see the same machine load: where the MoE's
tokens/s go (research/moe/compare.py measures whole runs).

    OMP_NUM_THREADS=1 python research/moe/step_time.py
"""
from __future__ import annotations

import time

import torch

import attnlab
from attnlab.config import ModelConfig
from attnlab.objectives.clm import clm_loss

BASE = dict(model_type="mixtral", causal=True, hidden_size=128, num_layers=4, num_heads=4, intermediate_size=256,
            num_experts=8, experts_top_k=2, router_aux_loss_coef=0.01, max_position_embeddings=64, position="rope",
            norm="rmsnorm", norm_placement="pre", activation="swiglu", embedding_norm=False, final_norm=True,
            pooler=False, type_vocab_size=0, bias=False, dropout=0.0, attention_dropout=0.0, pad_token_id=None,
            vocab_size=65)


def main(reps: int = 10) -> None:
    torch.manual_seed(0)
    models = {"moe": attnlab.from_config(ModelConfig(**BASE)).train(),
              "dense": attnlab.from_config(ModelConfig(**{**BASE, "num_experts": 0, "intermediate_size": 512,
                                                            "model_type": "llama"})).train()}
    ids = torch.randint(0, 65, (12, 65))
    batch = {"input_ids": ids[:, :-1], "labels": ids[:, 1:]}

    def step(model) -> None:
        loss, _ = clm_loss(model, batch)
        loss.backward()

    for model in models.values():
        step(model)  # warm-up
    seconds = dict.fromkeys(models, 0.0)
    for _ in range(reps):
        for name, model in models.items():
            start = time.perf_counter()
            step(model)
            seconds[name] += time.perf_counter() - start
    ms = {name: s / reps * 1000 for name, s in seconds.items()}
    print(f"ms per step: moe {ms['moe']:.1f}, dense {ms['dense']:.1f}; moe/dense {ms['moe'] / ms['dense']:.2f}; "
          f"load {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
