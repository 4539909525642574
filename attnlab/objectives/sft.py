"""Instruction tuning (supervised fine-tuning on conversations, Ouyang et al. 2022 §3.5 / Wei et al. 2022):
the next-token loss of a causal LM, counted on the assistant's tokens only.

A conversation is rendered with the model's own chat template (inference/chat.py), turn by turn, so
that the exact tokens the model will see at inference are the ones it trains on; the prompt side
(system, user, the template's markup) is labelled -100 (ignored), each assistant answer (with its
end-of-turn marker, so the model learns to stop) is labelled with itself.

    <|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n | Hello!<|im_end|>\\n
    ---------------------- ignored ------------------------- | ------ trained -----

Packing puts several short conversations in one row of `seq_len` tokens (no compute spent on padding).
Without care, a token would attend to the conversation packed before it; `document_ids` give attention a
block-diagonal mask (nn/attention.py), `position_ids` restart at each conversation, and a conversation's
first token is never a target of the one before it: a packed row computes exactly what its
conversations would alone.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ..inference.chat import apply_chat_template

IGNORE = -100


def chat_example(tokenizer, messages: Sequence[dict]) -> dict[str, list[int]]:
    """{"input_ids", "labels"} of one conversation: labels are the ids on assistant turns, IGNORE elsewhere."""
    if not any(m.get("role") == "assistant" for m in messages if isinstance(m, dict)):
        raise ValueError("conversation has no assistant message: nothing to learn from")
    ids: list[int] = []
    labels: list[int] = []
    done = ""
    for i, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        before = apply_chat_template(tokenizer, messages[:i], add_generation_prompt=True) if i else ""
        after = apply_chat_template(tokenizer, messages[:i + 1], add_generation_prompt=False)
        if not (before.startswith(done) and after.startswith(before)):
            raise ValueError("the chat template does not render a conversation as a prefix of its continuation; "
                             "cannot tell the assistant's tokens apart")
        prompt = tokenizer.encode(before[len(done):], add_special_tokens=False)
        answer = tokenizer.encode(after[len(before):], add_special_tokens=False)
        ids += prompt + answer
        labels += [IGNORE] * len(prompt) + answer
        done = after
    return {"input_ids": ids, "labels": labels}


def pack(examples: Sequence[dict], seq_len: int) -> list[list[int]]:
    """Rows of example indices, greedily filled in order up to `seq_len` tokens (an example longer than
    `seq_len` gets a row of its own and is cut by `collate_packed`)."""
    rows: list[list[int]] = []
    used = seq_len
    for i, ex in enumerate(examples):
        n = min(len(ex["input_ids"]), seq_len)
        if used + n > seq_len:
            rows.append([])
            used = 0
        rows[-1].append(i)
        used += n
    return rows


def collate_packed(groups: Sequence[Sequence[dict]], seq_len: int, pad_id: int = 0) -> dict[str, torch.Tensor]:
    """A batch of packed rows: input_ids, labels, position_ids (restarting per example), document_ids
    (1, 2, ... per example; 0 on padding) and attention_mask (0 on padding)."""
    width = min(seq_len, max(sum(min(len(e["input_ids"]), seq_len) for e in g) for g in groups))
    shape = (len(groups), width)
    ids, labels = torch.full(shape, pad_id), torch.full(shape, IGNORE)
    pos, docs, mask = torch.zeros(shape, dtype=torch.long), torch.zeros(shape, dtype=torch.long), torch.zeros(shape, dtype=torch.long)
    for r, group in enumerate(groups):
        at = 0
        for d, ex in enumerate(group, start=1):
            n = min(len(ex["input_ids"]), width - at)
            if n <= 0:
                break
            ids[r, at:at + n] = torch.tensor(ex["input_ids"][:n])
            lab = torch.tensor(ex["labels"][:n])
            lab[0] = IGNORE  # the previous example's last token must not learn to predict this one
            labels[r, at:at + n] = lab
            pos[r, at:at + n] = torch.arange(n)
            docs[r, at:at + n] = d
            mask[r, at:at + n] = 1
            at += n
    return {"input_ids": ids, "labels": labels, "position_ids": pos, "document_ids": docs, "attention_mask": mask}


def sft_loss(model, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Mean cross-entropy over the trained (assistant) tokens of the batch; sums for evaluation."""
    out = model(**batch)
    with torch.no_grad():
        n = (batch["labels"][:, 1:] != IGNORE).sum().float()
    return out.loss, {"loss_sum": out.loss.detach() * n, "n": n}
