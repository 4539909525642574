"""Zero- and few-shot sentiment classification by prompting a decoder: k labelled demonstrations from
--pool (drawn with --seed), then each --data sentence; the label word ("negative"/"positive") with the
higher log-probability after "Sentiment:" is the prediction. Prints accuracy per k as JSON.

example:
  attnlab evaluate-prompting --model smollm2 --data heldout.tsv --pool train.tsv --shots 0,1,4,8 --limit 200
"""
from __future__ import annotations

import argparse
import json

NAME = "evaluate-prompting"
HELP = "zero/k-shot classification with a decoder by label log-probabilities (SST-2 format); prints JSON"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="a causal LM directory, a .gguf file or a packaged name (smollm2)")
    p.add_argument("--data", required=True, help="test sentences, SST-2 tsv (sentence<TAB>label 0/1)")
    p.add_argument("--pool", required=True, help="demonstrations to draw from, same format")
    p.add_argument("--shots", default="0,1,4,8", help="comma-separated k values (default 0,1,4,8)")
    p.add_argument("--limit", type=int, help="score only the first N test sentences")
    p.add_argument("--seed", type=int, default=0, help="which demonstrations (default 0)")
    p.add_argument("--batch-size", type=int, default=16)


def run(args: argparse.Namespace) -> int:
    import attnlab
    from ..tasks import get_task
    from ..tasks.prompting import evaluate_prompting
    try:
        shots = [int(k) for k in args.shots.split(",")]
    except ValueError:
        raise ValueError(f"--shots {args.shots!r}: expected comma-separated integers, e.g. 0,1,4,8") from None
    if any(k < 0 for k in shots):
        raise ValueError(f"--shots {args.shots!r}: k must not be negative")
    words = ("negative", "positive")
    task = get_task("sst2")

    def read(path):
        return [(" ".join(ex["texts"][0].split()), words[int(ex["label"])]) for ex in task.read(path)]
    test, pool = read(args.data)[:args.limit], read(args.pool)
    model = attnlab.load(args.model).eval()
    if not model.config.causal or not hasattr(model, "lm_head"):
        raise ValueError(f"{args.model}: prompting needs a causal LM")
    results = evaluate_prompting(model, attnlab.load_tokenizer(args.model), test, pool, shots, words, args.seed,
                                 args.batch_size)
    print(json.dumps({"model": args.model, "examples": len(test), "seed": args.seed,
                      **{f"{k}-shot": v for k, v in results.items()}}))
    return 0
