"""Write benchmarks/serve_requests.jsonl: the fixed chat workload of benchmarks/serve_vs_llama_server.py.

Each line is one OpenAI chat request over real text: a passage of a Project Gutenberg novel or of Tiny
Shakespeare under an instruction ("Summarize...", "Continue...", a question about it), with a system
message (so that every server renders the same prompt: SmolLM2's template adds its own system line only
when the request has none). Prompt lengths are 20-400 tokens counted with SmolLM2's tokenizer after its
chat template, max_tokens 16-256, both skewed the way chat traffic is: more short requests than long.

    .venv/bin/python benchmarks/make_serve_requests.py [--count 96] [--seed 0] [--out benchmarks/serve_requests.jsonl]

The file is committed; rerunning with the same seed and data writes the same bytes.
"""
from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, data_root  # noqa: E402

SYSTEM = "You are a helpful assistant."
INSTRUCTIONS = (
    "Summarize the following passage in a few sentences.",
    "Continue this text for a paragraph, in the same style.",
    "Who are the people in this passage, and what do they want?",
    "Rewrite this passage in plain modern English.",
    "What is the mood of this passage? Explain briefly.",
    "Give three questions a reader might ask after reading this.",
)
SHORT_INSTRUCTIONS = ("Continue:", "Summarize:", "Explain:", "Who is speaking?")  # the template alone is ~20 tokens
SHORT_PROMPT = 80  # targets below this many tokens get a short instruction
# prompt tokens and max_tokens: (low, high, weight) buckets; short requests are the common case
PROMPT_BUCKETS = ((20, 60, 0.35), (60, 150, 0.30), (150, 280, 0.22), (280, 400, 0.13))
OUTPUT_BUCKETS = ((16, 48, 0.40), (48, 96, 0.30), (96, 160, 0.18), (160, 256, 0.12))


def bucket(rng: random.Random, buckets) -> int:
    low, high, _ = rng.choices(buckets, weights=[b[2] for b in buckets])[0]
    return rng.randint(low, high)


def paragraphs(root: Path) -> list[tuple[str, str]]:
    """(source, paragraph) pairs of at least a few words, from every book's body and Tiny Shakespeare."""
    out = []
    for book in sorted((root / "gutenberg").glob("*.txt")):
        text = book.read_text(encoding="utf-8", errors="replace")
        start, end = text.find("*** START OF"), text.find("*** END OF")
        body = text[text.find("\n", start) + 1 if start >= 0 else 0: end if end >= 0 else len(text)]
        for para in re.split(r"\n\s*\n", body):
            words = para.split()
            if len(words) >= 8:
                out.append((f"gutenberg/{book.name}", " ".join(words)))
    shakespeare = (root / "tiny_shakespeare" / "input.txt").read_text(encoding="utf-8")
    for para in re.split(r"\n\s*\n", shakespeare):
        if len(para.split()) >= 8:
            out.append(("tiny_shakespeare", para.strip()))
    return out


def fit(count_tokens, instruction: str, words: list[str], target: int) -> tuple[str, int]:
    """The longest prefix of `words` whose prompt stays within `target` tokens (binary search)."""
    def prompt(n: int) -> str:
        return f"{instruction}\n\n{' '.join(words[:n])}" if n else instruction
    lo, hi = 0, len(words)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count_tokens(prompt(mid)) <= target:
            lo = mid
        else:
            hi = mid - 1
    return prompt(lo), count_tokens(prompt(lo))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=96)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(REPO / "benchmarks" / "serve_requests.jsonl"))
    args = p.parse_args()
    import attnlab
    from attnlab.inference.chat import apply_chat_template

    tok = attnlab.load_tokenizer("smollm2")

    def count_tokens(user: str) -> int:
        text = apply_chat_template(tok, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}])
        return len(tok.encode(text, add_special_tokens=False))

    rng = random.Random(args.seed)
    paras = paragraphs(data_root())
    rows = []
    while len(rows) < args.count:
        target = bucket(rng, PROMPT_BUCKETS)
        instruction = rng.choice(SHORT_INSTRUCTIONS if target < SHORT_PROMPT else INSTRUCTIONS)
        # a passage long enough for the target: consecutive paragraphs from a random place in one source
        i = rng.randrange(len(paras))
        source, words = paras[i][0], []
        while len(words) < target and i < len(paras) and paras[i][0] == source:
            words += paras[i][1].split()
            i += 1
        user, n = fit(count_tokens, instruction, words, target)
        if n < 20 or n < 0.8 * target or n == count_tokens(instruction):  # no room, or the source ran out
            continue
        rows.append({"id": len(rows), "source": source, "prompt_tokens": n, "max_tokens": bucket(rng, OUTPUT_BUCKETS),
                     "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]})
    out = Path(args.out)
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    lengths = sorted(r["prompt_tokens"] for r in rows)
    news = sorted(r["max_tokens"] for r in rows)
    mid = len(rows) // 2
    print(f"{out}: {len(rows)} requests, {out.stat().st_size / 1024:.0f} KB; prompt tokens min/median/max "
          f"{lengths[0]}/{lengths[mid]}/{lengths[-1]}, max_tokens {news[0]}/{news[mid]}/{news[-1]} (sum {sum(news)})")


if __name__ == "__main__":
    main()
