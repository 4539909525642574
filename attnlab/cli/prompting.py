"""Prompt a decoder without training it, and score it. --task sst2 (default): zero/k-shot sentiment;
k labelled demonstrations from --pool, then each --data sentence (tsv: sentence<TAB>label 0/1);
the label word with the higher log-probability after "Sentiment:" is the prediction. --task
arithmetic: generated two-step word problems, answered directly, by chain of thought, or by
self-consistency (a majority vote over sampled chains). Prints JSON; --output FILE keeps every
problem's outputs.

examples:
  attnlab evaluate-prompting --model smollm2 --data held-out.tsv --pool train.tsv --shots 0,1,4
  attnlab evaluate-prompting --model smollm2 --task arithmetic --problems 20 --mode cot

Guide: docs/guides/command-details.md (evaluate-prompting)
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

NAME = "evaluate-prompting"
HELP = "zero/k-shot prompting of a decoder, scored without training"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="a causal LM directory, a .gguf file or a packaged name (smollm2)")
    p.add_argument("--task", choices=("sst2", "arithmetic"), default="sst2")
    p.add_argument("--data", help="sst2: test sentences, SST-2 tsv (sentence<TAB>label 0/1)")
    p.add_argument("--pool", help="sst2: demonstrations to draw from, same format")
    p.add_argument("--shots", type=_counts, help="sst2: comma-separated k values (default 0,1,4,8); arithmetic: worked examples "
                                   "before each question (default 4)")
    p.add_argument("--limit", type=int, help="sst2: score only the first N test sentences")
    p.add_argument("--seed", type=int, default=0, help="which demonstrations / problems / samples (default 0)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--mode", type=_modes, default=["direct", "cot", "self-consistency"],
                   help="arithmetic: comma-separated modes (default direct,cot,self-consistency)")
    p.add_argument("--problems", type=int, default=50, help="arithmetic: how many problems (default 50)")
    p.add_argument("--samples", type=int, default=5, help="self-consistency: paths sampled per problem (default 5)")
    p.add_argument("--temperature", type=float, default=0.7, help="self-consistency: sampling temperature (0.7)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="arithmetic: tokens per chain of thought (64)")
    p.add_argument("--output", help="write the results JSON, with every problem's outputs, to this file")


def _counts(value: str) -> list[int]:
    """argparse type of --shots: bad values exit 2 with argparse's one-line usage error."""
    try:
        values = [int(k) for k in value.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: expected comma-separated integers, e.g. 0,1,4,8") from None
    if any(k < 0 for k in values):
        raise argparse.ArgumentTypeError(f"{value!r}: must not be negative")
    return values


def _modes(value: str) -> list[str]:
    from ..tasks.reasoning import MODES
    modes = value.split(",")
    if any(m not in MODES for m in modes):
        raise argparse.ArgumentTypeError(f"{value!r}: expected comma-separated modes from {', '.join(MODES)}")
    return modes


def run(args: argparse.Namespace) -> int:
    import attnlab
    if args.task == "sst2" and not (args.data and args.pool):
        raise ValueError("--task sst2 needs --data (test sentences) and --pool (demonstrations)")
    if args.task == "arithmetic" and (args.problems < 1 or args.samples < 1 or args.temperature <= 0):
        raise ValueError(f"--problems {args.problems}, --samples {args.samples}: must be at least 1; --temperature "
                         f"{args.temperature}: must be above 0")
    model = attnlab.load(args.model).eval()
    if not model.config.causal or not hasattr(model, "lm_head"):
        raise ValueError(f"{args.model}: prompting needs a causal LM")
    tokenizer = attnlab.load_tokenizer(args.model)
    head = {"model": args.model, "task": args.task, "seed": args.seed}
    if args.task == "sst2":
        results = {**head, **_sst2(args, model, tokenizer)}
    else:
        from ..tasks.reasoning import arithmetic_problems, evaluate_arithmetic
        if args.shots and len(args.shots) > 1:
            raise ValueError(f"--shots: --task arithmetic takes one number of worked examples, got {len(args.shots)}")
        k = args.shots[0] if args.shots else 4
        # demonstrations from another seed than the test problems: no test question is among the shots
        shots, problems = arithmetic_problems(k, seed=10_000 + args.seed), arithmetic_problems(args.problems, args.seed)
        per_mode = evaluate_arithmetic(model, tokenizer, problems, shots, args.mode, args.samples, args.temperature,
                                       args.max_new_tokens, args.seed, args.batch_size)
        results = {**head, "problems": len(problems), "shots": k, **per_mode}
    if args.output:
        Path(args.output).write_text(json.dumps(results, indent=1) + "\n")
    summary = {key: ({k: v for k, v in val.items() if k != "outputs"} if isinstance(val, dict) else val)
               for key, val in results.items()}
    print(json.dumps(summary))
    return 0


def _sst2(args, model, tokenizer) -> dict:
    from ..tasks import get_task
    from ..tasks.prompting import evaluate_prompting
    shots = args.shots or [0, 1, 4, 8]
    words = ("negative", "positive")
    task = get_task("sst2")

    def read(path):
        return [(" ".join(ex["texts"][0].split()), words[int(ex["label"])]) for ex in task.read(path)]
    test, pool = read(args.data)[:args.limit], read(args.pool)
    results = evaluate_prompting(model, tokenizer, test, pool, shots, words, args.seed, args.batch_size)
    return {"examples": len(test), **{f"{k}-shot": v for k, v in results.items()}}
