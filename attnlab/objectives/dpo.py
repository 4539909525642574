"""Direct Preference Optimization (Rafailov et al. 2023): RLHF's goal without a reward model or RL.

Given a prompt x with a preferred answer y_w and a dispreferred y_l, the loss (the paper's eq. 7) is

    L_DPO = -E[ log σ( β log π_θ(y_w|x)/π_ref(y_w|x) - β log π_θ(y_l|x)/π_ref(y_l|x) ) ]

with π_ref the frozen starting model and β the strength of the implicit KL constraint to it;
β log π_θ(y|x)/π_ref(y|x) is the implicit reward (§5). log π(y|x) is the sum of the answer's token
log-probabilities (the prompt's tokens are not scored). With LoRA the reference is the same network
with its adapters switched off (nn.lora.adapters_disabled): one copy of the weights serves both.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from ..nn.lora import adapter_modules, adapters_disabled
from .sft import IGNORE, chat_example



def sequence_logprobs(model, batch: dict) -> torch.Tensor:
    """(B,) sum over labelled positions of log p(token_t | tokens_<t); labels are the input ids with
    IGNORE on the prompt and padding (the same layout as objectives/sft.py)."""
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    logits = model(**inputs).logits[:, :-1].float()
    target = batch["labels"][:, 1:]
    keep = target != IGNORE
    logp = torch.gather(logits.log_softmax(-1), 2, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (logp * keep).sum(-1)


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float = 0.1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Eq. 7 from sequence log-probabilities: (mean loss, chosen rewards, rejected rewards), the rewards
    β log π_θ/π_ref per example (detached)."""
    chosen = beta * (policy_chosen - ref_chosen)
    rejected = beta * (policy_rejected - ref_rejected)
    loss = -F.logsigmoid(chosen - rejected).mean()
    return loss, chosen.detach(), rejected.detach()


def dpo_batch_loss(policy, batch: dict, beta: float = 0.1, reference=None) -> tuple[torch.Tensor, dict]:
    """`batch` holds 2B rows: the B chosen answers, then the B rejected ones (same prompts, same order).
    `reference=None`: the policy with its adapters disabled. Returns (loss, sums for the Trainer)."""
    n = batch["input_ids"].size(0) // 2
    if reference is None and not adapter_modules(policy):
        raise ValueError("DPO without a reference model needs adapters on the policy (the reference is the policy "
                         "with them disabled); pass reference= for full fine-tuning")
    logps = sequence_logprobs(policy, batch)
    with torch.no_grad():
        ctx = adapters_disabled(policy) if reference is None else contextlib.nullcontext()
        with ctx:
            ref = sequence_logprobs(policy if reference is None else reference, batch)
    loss, chosen, rejected = dpo_loss(logps[:n], logps[n:], ref[:n], ref[n:], beta)
    count = torch.tensor(float(n))
    return loss, {"loss_sum": loss.detach() * count, "n": count, "reward_margin_sum": (chosen - rejected).sum(),
                  "accuracy_sum": (chosen > rejected).float().sum()}


def dpo_metrics(sums: dict[str, float]) -> dict[str, float]:
    n = max(sums["n"], 1)
    return {"loss": sums["loss_sum"] / n, "reward_margin": sums["reward_margin_sum"] / n,
            "reward_accuracy": sums["accuracy_sum"] / n}


def answer_example(tokenizer, prompt: str, answer: str, chat: bool = False) -> dict[str, list[int]]:
    """{"input_ids", "labels"} of a prompt and its answer, only the answer labelled: as a chat turn
    (the model's template) or as a plain continuation of the prompt text."""
    if chat:
        return chat_example(tokenizer, [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}])
    p = tokenizer.encode(prompt, add_special_tokens=False)
    a = tokenizer.encode(answer, add_special_tokens=False)
    if not a:
        raise ValueError(f"empty answer for prompt {prompt[:40]!r}")
    return {"input_ids": p + a, "labels": [IGNORE] * len(p) + a}


def right_pad(rows: list[dict], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """input_ids / labels / attention_mask of {"input_ids", "labels"} rows, right-padded to the longest."""
    width = max(len(r["input_ids"]) for r in rows)
    ids = torch.full((len(rows), width), pad_id)
    labels = torch.full((len(rows), width), IGNORE)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        ids[i, :n], labels[i, :n], mask[i, :n] = torch.tensor(r["input_ids"]), torch.tensor(r["labels"]), 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def preference_batch(examples: list[tuple[dict, dict]], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """2B right-padded rows from B (chosen, rejected) pairs of answer_example dicts: chosen rows first."""
    return right_pad([c for c, _ in examples] + [r for _, r in examples], pad_id)
