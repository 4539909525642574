"""MLM pretraining throughput: attnlab vs transformers' BertForMaskedLM, same model, data and optimizer.

Model: MiniLM-L6 shape (6 layers x 384, 12 heads, FFN 1536, vocab 30522); batch 32 x 128 packed
Gutenberg + WikiText-2 blocks (no padding), 15% masking, AdamW lr 1e-4 (no decay on biases/norms),
one process. Prints tokens/s for each setup and the ratio to transformers fp32, then trains each setup
for the same wall-clock budget and prints the held-out MLM loss it reached.

attnlab's levers: sparse prediction (the 30522-way projection only on the ~15% masked positions),
no padding (packed blocks: no attention mask, the fused SDPA kernel's fastest path), bf16 autocast.
bf16 only pays on CPUs with AVX512-BF16 or AMX; on an AVX2-only CPU a bf16 matmul is ~10x slower than
fp32 (measured 0.6 vs 5.9 GFLOP/s, one thread), so leave the bf16 setups out there (--setups).
Measured here (AVX2 EPYC, 1 thread, machine shared with other jobs, load ~15): transformers fp32
56 tokens/s, attnlab fp32 116 tokens/s (2.07x).

    .venv/bin/python benchmarks/pretrain_vs_transformers.py [--steps 6] [--budget 120] [--threads N]
"""
from __future__ import annotations

import argparse
import glob
import math
import os
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from attnlab.config import preset  # noqa: E402
from attnlab.data import open_shards, prepare_corpus  # noqa: E402
from attnlab.data.stream import BatchStream, fixed_batches  # noqa: E402
from attnlab.heads import MaskedLM  # noqa: E402
from attnlab.objectives import ObjectiveConfig, build_objective  # noqa: E402
from attnlab.tokenizers import load_tokenizer  # noqa: E402
from attnlab.training.optim import param_groups  # noqa: E402

DATA = Path(os.environ.get("ATTNLAB_DATA", REPO.parent / "shared" / "data"))


def corpus(path: Path) -> Path:
    if not (path / "meta.json").exists():
        files = sorted(glob.glob(str(DATA / "gutenberg" / "*.txt"))) + [str(DATA / "wikitext-2" / "valid.txt")]
        prepare_corpus(load_tokenizer(DATA / "vocab" / "bert-base-uncased"), files, path, heldout=0.02)
    return path


def build(setup: str, seed: int = 0):
    torch.manual_seed(seed)
    if setup.startswith("transformers"):
        import transformers
        cfg = transformers.BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                                      intermediate_size=1536, max_position_embeddings=512)
        cfg._attn_implementation = "sdpa"
        return transformers.BertForMaskedLM(cfg).train()
    return MaskedLM(preset("minilm-l6")).train()


def step_fn(setup: str):
    """(model, batch) -> loss; transformers gets dense labels (it always projects every position)."""
    sparse = "dense" not in setup

    def run(model, batch):
        if setup.startswith("transformers"):
            return model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
        if sparse:
            return model(input_ids=batch["input_ids"], labels=batch["labels"],
                         masked_positions=batch["masked_positions"]).loss
        return model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
    return run


def autocast(setup: str):
    if "bf16" in setup:
        return torch.autocast("cpu", dtype=torch.bfloat16)
    import contextlib
    return contextlib.nullcontext()


def train_steps(setup, model, opt, stream, n, run):
    for _ in range(n):
        batch = next(stream)
        with autocast(setup):
            loss = run(model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return float(loss.detach())


@torch.no_grad()
def eval_loss(setup, model, batches, run) -> float:
    model.eval()
    total = 0.0
    for b in batches:
        with autocast(setup):
            total += float(run(model, b))
    model.train()
    return total / len(batches)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=6, help="timed steps per setup (after 2 warm-up steps)")
    ap.add_argument("--budget", type=float, default=120, help="seconds of training per setup for the loss race")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--corpus", type=Path, default=Path("runs/corpus-gutenberg-wikitext-bert"))
    ap.add_argument("--setups", default="transformers-fp32,attnlab-fp32,attnlab-bf16,attnlab-fp32-dense,transformers-bf16")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    path = corpus(args.corpus)
    tok = load_tokenizer(path / "tokenizer")
    obj = build_objective(ObjectiveConfig(kind="mlm"), tok, 128)
    heldout = fixed_batches(open_shards(path, "heldout"), obj.examples, obj.collate, 32, max_batches=4)
    setups = args.setups.split(",")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}, batch 32 x 128 = 4096 tokens/step")

    speed, race = {}, {}
    for setup in setups:
        run = step_fn(setup)
        model = build(setup)
        opt = torch.optim.AdamW(param_groups(model, 0.01), lr=1e-4)
        stream = BatchStream(open_shards(path), obj.examples, obj.collate, 32, seed=0)
        train_steps(setup, model, opt, stream, 2, run)  # warm-up (allocator, kernels)
        t = time.perf_counter()
        train_steps(setup, model, opt, stream, args.steps, run)
        speed[setup] = args.steps * 4096 / (time.perf_counter() - t)
        print(f"{setup:22s} {speed[setup]:8.0f} tokens/s", flush=True)

        if args.budget > 0:  # the loss race: fresh model, same data order, same wall-clock budget
            model = build(setup)
            opt = torch.optim.AdamW(param_groups(model, 0.01), lr=1e-4)
            stream = BatchStream(open_shards(path), obj.examples, obj.collate, 32, seed=0)
            start, steps = time.perf_counter(), 0
            while time.perf_counter() - start < args.budget:
                train_steps(setup, model, opt, stream, 1, run)
                steps += 1
            race[setup] = (steps, eval_loss(setup, model, heldout, step_fn("transformers" if setup.startswith(
                "transformers") else "attnlab-fp32-dense")))
            print(f"{'':22s} after {args.budget:.0f} s: {steps} steps, held-out MLM loss {race[setup][1]:.3f}",
                  flush=True)

    base = speed.get("transformers-fp32")
    print("\n| setup | tokens/s | vs transformers fp32 |" + (f" steps in {args.budget:.0f} s | held-out MLM loss |"
                                                           if race else ""))
    print("|---|---|---|" + ("---|---|" if race else ""))
    for setup in setups:
        ratio = f"{speed[setup] / base:.2f}x" if base else "-"
        extra = f" {race[setup][0]} | {race[setup][1]:.3f} |" if setup in race else ""
        print(f"| {setup} | {speed[setup]:.0f} | {ratio} |{extra}")
    if race:
        print(f"(untrained loss would be ln(30522) = {math.log(30522):.2f})")


if __name__ == "__main__":
    main()
