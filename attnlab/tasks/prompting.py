"""Zero- and few-shot classification by prompting (Brown et al. 2020, §2): no weight changes; the model
reads k labelled demonstrations and the test input, and the label whose words it finds most probable
next wins.

    Review: a gorgeous, witty film.            <- k demonstrations (drawn with a seed from a training pool)
    Sentiment: positive

    Review: the plot is a mess.                <- the test input
    Sentiment:                                 <- score log p(" positive") vs log p(" negative")

The score of a label is the sum of its tokens' log-probabilities after the prompt (objectives/dpo.py's
`sequence_logprobs`), so multi-token label words are compared fairly by their whole text.
"""
from __future__ import annotations

import random
from typing import Sequence

import torch

from ..objectives.dpo import answer_example, right_pad, sequence_logprobs


def kshot_prompt(demos: Sequence[tuple[str, str]], text: str, template: str = "Review: {text}\nSentiment:") -> str:
    """The demonstrations (text, label word), each followed by a blank line, then the test input."""
    shots = "".join(template.format(text=t) + f" {label}\n\n" for t, label in demos)
    return shots + template.format(text=text)


def draw_demos(pool: Sequence[tuple[str, str]], k: int, seed: int) -> list[tuple[str, str]]:
    if k > len(pool):
        raise ValueError(f"{k} demonstrations asked for, the pool has {len(pool)}")
    return random.Random(seed).sample(list(pool), k)


def label_scores(model, tokenizer, prompts: Sequence[str], label_words: Sequence[str], batch_size: int = 16,
                 pad_id: int = 0) -> torch.Tensor:
    """(len(prompts), len(label_words)): log p(" word" | prompt) for every prompt and label word."""
    rows = [answer_example(tokenizer, p, " " + w) for p in prompts for w in label_words]
    out = []
    for k in range(0, len(rows), batch_size):
        with torch.no_grad():
            out.append(sequence_logprobs(model, right_pad(rows[k:k + batch_size], pad_id)))
    return torch.cat(out).view(len(prompts), len(label_words))


def evaluate_prompting(model, tokenizer, test: Sequence[tuple[str, str]], pool: Sequence[tuple[str, str]],
                       shots: Sequence[int] = (0, 1, 4, 8), label_words: Sequence[str] = ("negative", "positive"),
                       seed: int = 0, batch_size: int = 16) -> dict[int, dict]:
    """Accuracy for each k in `shots`. `test` and `pool` hold (text, label word); one draw of demonstrations
    (seeded) serves every test input of a k."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    gold = torch.tensor([list(label_words).index(y) for _, y in test])
    results = {}
    for k in shots:
        demos = draw_demos(pool, k, seed + k)
        scores = label_scores(model, tokenizer, [kshot_prompt(demos, t) for t, _ in test], label_words, batch_size, pad)
        pred = scores.argmax(-1)
        results[k] = {"accuracy": round(100 * (pred == gold).float().mean().item(), 1),
                      "predicted_share": {w: round((pred == i).float().mean().item(), 3) for i, w in enumerate(label_words)}}
    return results
