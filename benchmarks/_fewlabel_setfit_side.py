"""The setfit side of benchmarks/fewlabel_vs_setfit.py, run by it as a subprocess with the python of the setfit
venv (scripts/setfit-venv.sh): setfit's own recipe on one draw, then predictions on the report set. It imports
no attnlab (that venv has none) and touches no network (HF_HUB_OFFLINE: the model is a local directory).

    python _fewlabel_setfit_side.py --model DIR --train DRAW.jsonl --report REPORT.jsonl --output DIR
        [--seed 42] [--threads 1] [--num-iterations 20]

Files are JSON lines {"text", "label"}. Writes OUTPUT/predictions.json; its last stdout line is one JSON
object: the recipe as run, the versions, and the wall/CPU seconds of training and of predicting.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def read(path: str) -> tuple[list[str], list[int]]:
    rows = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    if not rows:
        raise SystemExit(f"{path}: no examples")
    return [r["text"] for r in rows], [int(r["label"]) for r in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a local sentence-transformers directory")
    ap.add_argument("--train", required=True)
    ap.add_argument("--report", required=True)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--output", required=True)
    ap.add_argument("--num-iterations", type=int, default=None,
                    help="setfit's num_iterations (default: its own default, all pairs oversampled)")
    a = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    t_start, c_start = time.perf_counter(), time.process_time()

    import importlib.metadata as md

    import torch
    from datasets import Dataset
    from setfit import SetFitModel, Trainer, TrainingArguments

    torch.set_num_threads(a.threads)
    texts, labels = read(a.train)
    report_texts, _ = read(a.report)
    out = Path(a.output)
    out.mkdir(parents=True, exist_ok=True)
    model = SetFitModel.from_pretrained(a.model)
    # setfit's TrainingArguments defaults; only what a benchmark must set is set: the seed, where checkpoints
    # go, no reporting integrations, no progress bars in the log, and num_iterations when the caller capped it.
    extra = {} if a.num_iterations is None else {"num_iterations": a.num_iterations}
    args = TrainingArguments(output_dir=str(out / "checkpoints"), seed=a.seed, report_to="none",
                             show_progress_bar=False, **extra)
    trainer = Trainer(model=model, args=args, train_dataset=Dataset.from_dict({"text": texts, "label": labels}))
    pairs = None
    try:  # how many contrastive pairs the recipe trained on (for the record; the API may not expose it)
        from setfit.sampler import ContrastiveDataset
        pairs = len(ContrastiveDataset(texts, labels, model.multi_target_strategy, num_iterations=a.num_iterations,
                                       sampling_strategy=args.sampling_strategy))
    except Exception:  # noqa: BLE001 - only a note in the output
        pass
    trainer.train()
    t_trained, c_trained = time.perf_counter(), time.process_time()
    predictions = [int(p) for p in model.predict(report_texts, batch_size=64)]
    t_done, c_done = time.perf_counter(), time.process_time()
    (out / "predictions.json").write_text(json.dumps(predictions))

    def plain(value):
        return value if isinstance(value, (int, float, str, bool, type(None))) else repr(value)

    recipe = {k: plain(getattr(args, k)) for k in ("batch_size", "num_epochs", "num_iterations", "sampling_strategy",
                                                  "body_learning_rate", "head_learning_rate", "max_steps",
                                                  "end_to_end", "warmup_proportion", "max_length", "seed")}
    recipe["head"] = type(model.model_head).__name__
    print(json.dumps({
        "recipe": recipe, "pairs": pairs, "train_examples": len(texts), "report_examples": len(report_texts),
        "versions": {p: md.version(p) for p in ("setfit", "sentence-transformers", "transformers", "torch",
                                                "scikit-learn")},
        "threads": torch.get_num_threads(),
        "in_process_train_wall_s": round(t_trained - t_start, 2),
        "in_process_train_cpu_s": round(c_trained - c_start, 2),
        "predict_wall_s": round(t_done - t_trained, 2), "predict_cpu_s": round(c_done - c_trained, 2)}))


if __name__ == "__main__":
    main()
