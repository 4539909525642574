"""Evaluations during training score the weights as they are at that step. Regression: AdamW(fused=True)
updates weights without bumping their version counter, and the attention's stacked Q/K/V weights (the
no-grad fast path) outlived the optimizer steps after the first evaluation, so every later evaluation
scored stale Q/K/V weights (val loss rising while the saved model was fine)."""
from __future__ import annotations

import json

import torch

from attnlab.config import ModelConfig
from attnlab.models.decoder import CausalLM
from attnlab.training import Trainer, TrainArgs


def _lm() -> CausalLM:
    torch.manual_seed(0)
    return CausalLM(ModelConfig(model_type="gpt2", causal=True, vocab_size=50, hidden_size=32, num_layers=2,
                                num_heads=2, intermediate_size=64, max_position_embeddings=32, norm_placement="pre",
                                type_vocab_size=0, pooler=False, dropout=0.0, attention_dropout=0.0))


def _batches(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": (ids := torch.randint(0, 50, (4, 16), generator=g)), "labels": ids} for _ in range(n)]


def test_every_evaluation_scores_the_current_weights(tmp_path):
    eval_data = _batches(2, 7)
    model = _lm()
    args = TrainArgs(output_dir=str(tmp_path / "run"), max_steps=6, lr=3e-2, warmup_steps=0, fused_adamw=True,
                     progress=False, log_every=1, eval_every=2, save_every=0)
    trainer = Trainer(model, args, _batches(8, 1), eval_data=eval_data)
    trainer.train()
    evals = [json.loads(r)["eval_loss"] for r in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
             if "eval_loss" in r]
    assert len(evals) == 3
    fresh = _lm()
    fresh.load_state_dict(model.state_dict())  # the final weights in a model that never trained
    fresh.eval()
    with torch.no_grad():
        losses = [fresh(input_ids=b["input_ids"], labels=b["labels"]).loss for b in eval_data]
    assert evals[-1] == __import__("pytest").approx(float(sum(losses) / len(losses)), rel=1e-5)
