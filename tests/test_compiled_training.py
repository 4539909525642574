"""Faster training steps change nothing but the speed: a compiled step equals the eager step (loss and
updated weights), with and without gradient accumulation; fused AdamW equals the per-tensor AdamW; a
compiled run resumed from its checkpoint ends bit-identical to the uninterrupted compiled run."""
from __future__ import annotations

import pytest
import torch

from attnlab.config import ModelConfig
from attnlab.models.decoder import CausalLM
from attnlab.training import Trainer, TrainArgs
from attnlab.training.optim import build_optimizer, fused_supported

pytestmark = pytest.mark.slow  # torch.compile takes tens of seconds per graph on a CPU


def tiny_lm() -> CausalLM:
    torch.manual_seed(0)
    return CausalLM(ModelConfig(model_type="gpt2", causal=True, vocab_size=50, hidden_size=32, num_layers=2,
                                num_heads=2, intermediate_size=64, max_position_embeddings=32, norm_placement="pre",
                                type_vocab_size=0, pooler=False, dropout=0.0, attention_dropout=0.0))


def batches(n: int = 8):
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        ids = torch.randint(0, 50, (4, 16), generator=g)
        out.append({"input_ids": ids, "labels": ids})
    return out


def run(tmp_path, name: str, *, compile: bool, fused: bool = True, grad_accum: int = 1, steps: int = 3,
        until: int | None = None, resume: bool = False):
    model = tiny_lm()
    args = TrainArgs(output_dir=str(tmp_path / name), max_steps=steps, lr=1e-2, warmup_steps=0, grad_accum=grad_accum,
                     compile=compile, fused_adamw=fused, progress=False, log_every=1, save_every=1 if until else 0,
                     keep_last=2, resume=resume)
    trainer = Trainer(model, args, batches())
    trainer.train(until=until)
    return model, [r for r in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]


def _max_diff(a, b) -> float:
    return max(float((p - q).abs().max()) for p, q in zip(a.state_dict().values(), b.state_dict().values()))


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_compiled_step_equals_eager_step(tmp_path, grad_accum):
    eager, log_e = run(tmp_path, f"eager{grad_accum}", compile=False, grad_accum=grad_accum)
    compiled, log_c = run(tmp_path, f"compiled{grad_accum}", compile=True, grad_accum=grad_accum)
    loss = lambda log: [__import__("json").loads(r)["loss"] for r in log]  # noqa: E731
    assert loss(log_e) == pytest.approx(loss(log_c), abs=1e-5)
    assert _max_diff(eager, compiled) <= 1e-5


def test_fused_adamw_equals_per_tensor_adamw():
    """The same gradients into both optimizers for 5 steps: parameters stay within 1e-6 (float rounding;
    training on each model's own gradients would let the rounding feed back into the loss)."""
    a, b = tiny_lm(), tiny_lm()
    assert fused_supported(list(a.parameters()))
    opt_a, _ = build_optimizer(a, lr=1e-2, weight_decay=0.01, warmup_steps=0, max_steps=10, fused=False)
    opt_b, _ = build_optimizer(b, lr=1e-2, weight_decay=0.01, warmup_steps=0, max_steps=10, fused=True)
    assert opt_b.defaults.get("fused") and not opt_a.defaults.get("fused")
    for batch in batches(5):
        a(**batch).loss.backward()
        for p, q in zip(a.parameters(), b.parameters()):
            q.grad = None if p.grad is None else p.grad.clone()
        opt_a.step()
        opt_b.step()
        opt_a.zero_grad()
        opt_b.zero_grad()
    assert 0 < _max_diff(a, tiny_lm()) and _max_diff(a, b) <= 1e-6


def test_compiled_run_resumes_bit_identical(tmp_path):
    # One thread: with two, the compiled whole and resumed runs were seen to differ in the last bits (also
    # before this session's changes; cause not yet found). The one-thread run is bit-identical.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        whole, _ = run(tmp_path, "whole", compile=True, steps=4)
        run(tmp_path, "split", compile=True, steps=4, until=2)
        resumed, _ = run(tmp_path, "split", compile=True, steps=4, resume=True)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(p, q) for p, q in zip(whole.state_dict().values(), resumed.state_dict().values()))
    # with the default threads the two runs still agree to float rounding
    whole2, _ = run(tmp_path, "whole2", compile=True, steps=4)
    run(tmp_path, "split2", compile=True, steps=4, until=2)
    resumed2, _ = run(tmp_path, "split2", compile=True, steps=4, resume=True)
    assert _max_diff(whole2, resumed2) <= 1e-5
