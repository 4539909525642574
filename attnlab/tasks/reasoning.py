"""Chain of thought and self-consistency on generated two-step arithmetic word problems.

Chain-of-thought prompting (Wei et al. 2022): the few-shot demonstrations show the intermediate steps
before the answer, so the model writes steps too; direct prompting shows only the answer. Self-consistency
(Wang et al. 2023, §2): sample several reasoning paths at a temperature and answer by majority vote over
their final answers, instead of trusting the one greedy path.

    Q: Mia has 7 pens. She buys 5 more, then gives 3 away. How many pens does Mia have now?
    A: Mia starts with 7 pens. 7 + 5 = 12. 12 - 3 = 9. The answer is 9.        <- a chain-of-thought shot
    A: The answer is 9.                                                        <- the same shot, direct

Problems are generated from a seed (`arithmetic_problems`), so the set needs no download and its answers
are known; the demonstrations come from a different seed than the test problems.
"""
from __future__ import annotations

import random
import re
import time
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from ..inference.generate import encode_prompts, generate

MODES = ("direct", "cot", "self-consistency")
NAMES = ["Mia", "Tom", "Ana", "Leo", "Sara", "Ben", "Ivy", "Max"]
ITEMS = ["apples", "pens", "books", "stickers", "marbles", "cards", "cookies", "shells"]


@dataclass(frozen=True)
class Problem:
    question: str
    steps: str      # the worked solution, ending in "The answer is N."
    answer: int


def _problem(rng: random.Random) -> Problem:
    """One of three two-step templates: add then subtract, add twice, multiply then subtract; one-digit
    operands (a 135M model is the target: the steps, not the sums, should be what it gets wrong)."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    kind = rng.randrange(3)
    if kind == 0:
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        c = rng.randint(1, min(9, a + b - 1))
        q = f"{name} has {a} {item}. {name} buys {b} more, then gives {c} away. How many {item} does {name} have now?"
        s = f"{name} starts with {a} {item}. {a} + {b} = {a + b}. {a + b} - {c} = {a + b - c}."
        return Problem(q, f"{s} The answer is {a + b - c}.", a + b - c)
    if kind == 1:
        a, b, c = rng.randint(2, 9), rng.randint(2, 9), rng.randint(2, 9)
        q = f"{name} has {a} {item}. {name} finds {b} more, then gets {c} more. How many {item} does {name} have now?"
        s = f"{name} starts with {a} {item}. {a} + {b} = {a + b}. {a + b} + {c} = {a + b + c}."
        return Problem(q, f"{s} The answer is {a + b + c}.", a + b + c)
    a, b = rng.randint(2, 5), rng.randint(2, 5)
    c = rng.randint(1, 3)
    q = f"{name} buys {a} boxes with {b} {item} in each box, then gives {c} away. How many {item} are left?"
    s = f"{a} boxes of {b} {item} are {a} * {b} = {a * b} {item}. {a * b} - {c} = {a * b - c}."
    return Problem(q, f"{s} The answer is {a * b - c}.", a * b - c)


def arithmetic_problems(n: int, seed: int = 0) -> list[Problem]:
    rng = random.Random(seed)
    return [_problem(rng) for _ in range(n)]


def arithmetic_prompt(shots: Sequence[Problem], question: str, mode: str) -> str:
    """The demonstrations (with their steps for "cot" and "self-consistency", answer only for "direct"),
    then the question; the model continues after "A:"."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: expected one of {', '.join(MODES)}")
    solve = (lambda p: f"The answer is {p.answer}.") if mode == "direct" else (lambda p: p.steps)
    return "".join(f"Q: {p.question}\nA: {solve(p)}\n\n" for p in shots) + f"Q: {question}\nA:"


_ANSWER = re.compile(r"answer is\D{0,3}?(-?\d[\d,]*)", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d[\d,]*")


def extract_answer(text: str) -> int | None:
    """The number after the first "the answer is", else the last number in the text (up to the next
    question, which a model that keeps going would start), else None."""
    text = text.split("\nQ:")[0]
    m = _ANSWER.search(text)
    found = m.group(1) if m else (_NUMBER.findall(text) or [None])[-1]
    if found is None:
        return None
    digits = found.replace(",", "").rstrip("-")
    return int(digits) if digits not in ("", "-") else None


def majority_vote(answers: Sequence[int | None]) -> int | None:
    """The most frequent extracted answer (paths without one do not vote); a tie goes to the answer seen first."""
    votes = Counter(a for a in answers if a is not None)
    return votes.most_common(1)[0][0] if votes else None


def _complete(model, tokenizer, prompts: Sequence[str], max_new_tokens: int, temperature: float, seed: int,
              batch_size: int) -> list[str]:
    """The continuation of every prompt, cut at the first blank line (the end of an answer)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    texts = []
    for start in range(0, len(prompts), batch_size):
        ids, mask = encode_prompts(tokenizer, prompts[start:start + batch_size], pad)
        out = generate(model, ids, mask, max_new_tokens=max_new_tokens, temperature=temperature,
                       seed=seed + start, pad_token_id=pad, stop_strings=["\n\n"], tokenizer=tokenizer)
        for row in out[:, ids.size(1):].tolist():
            texts.append(tokenizer.decode(row, skip_special_tokens=True).split("\n\n")[0].strip())
    return texts


def evaluate_arithmetic(model, tokenizer, problems: Sequence[Problem], shots: Sequence[Problem],
                        modes: Sequence[str] = MODES, samples: int = 5, temperature: float = 0.7,
                        max_new_tokens: int = 64, seed: int = 0, batch_size: int = 8) -> dict:
    """Accuracy (%) per mode: direct and cot decode greedily; self-consistency samples `samples` chain-of-thought
    paths per problem at `temperature` and takes the majority answer (also reported: the mean accuracy of a
    single sampled path, what the vote is measured against). Each mode also lists every problem's outputs."""
    if samples < 1 or temperature <= 0:
        raise ValueError(f"self-consistency needs samples >= 1 and temperature > 0, got {samples} and {temperature}")
    results = {}
    gold = [p.answer for p in problems]
    for mode in modes:
        prompts = [arithmetic_prompt(shots, p.question, mode) for p in problems]
        wall, cpu = time.perf_counter(), time.process_time()
        if mode == "self-consistency":
            rows = [p for p in prompts for _ in range(samples)]
            texts = _complete(model, tokenizer, rows, max_new_tokens, temperature, seed, batch_size)
            paths = [[extract_answer(t) for t in texts[i * samples:(i + 1) * samples]] for i in range(len(problems))]
            answers = [majority_vote(p) for p in paths]
            single = sum(a == g for p, g in zip(paths, gold) for a in p) / (samples * len(problems))
            extra = {"samples": samples, "temperature": temperature, "single_path_accuracy": round(100 * single, 1)}
            outputs = [{"answer": a, "paths": p, "gold": g} for a, p, g in zip(answers, paths, gold)]
        else:
            texts = _complete(model, tokenizer, prompts, max_new_tokens if mode == "cot" else 12, 0.0, seed,
                              batch_size)
            answers = [extract_answer(t) for t in texts]
            extra = {}
            outputs = [{"answer": a, "text": t, "gold": g} for a, t, g in zip(answers, texts, gold)]
        correct = sum(a == g for a, g in zip(answers, gold))
        results[mode] = {"accuracy": round(100 * correct / len(problems), 1), **extra,
                         "answered": sum(a is not None for a in answers),
                         "seconds": round(time.perf_counter() - wall, 1),
                         "cpu_seconds": round(time.process_time() - cpu, 1), "outputs": outputs}
    return results

