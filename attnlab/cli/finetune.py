"""Fine-tune a pretrained encoder on a benchmark task and keep the best checkpoint.

TASK is one of sst2, mrpc, rte, cola, stsb (GLUE), conll2003 (NER), squad (extractive QA).
Training and validation files default to the task's files under ATTNLAB_DATA (default ../shared/data);
SST-2 has no dev set, so 872 whole training sentences are held out (fixed seed) for validation, and the
phrases of those sentences, which SST-2's train.tsv also lists, are left out of training.

Defaults that follow the data (each flag given explicitly wins):
  validation  without --valid (or the task's dev file), part of the training file is held out: 872
              examples when that is at most 10% of the file, else 10% of it. The split is printed to stderr.
  batch size  16 when fewer than 2,000 examples train, else the task's (SST-2: 32).
  lr          at least 1e-4 when fewer than 500 examples train, else the task's (SST-2: 5e-5).
  epochs      enough for at least 300 optimizer steps, at most 30 epochs, at least the task's (SST-2: 1):
              225 training examples get 20 epochs, 900 get 6, SST-2's 66,000 lines one.
  pooling     the checkpoint's: the pooled [CLS] vector for a Hugging Face BERT (a fresh pooler when it
              ships none, as all-MiniLM-L6-v2); --pooling mean reads the mean over tokens instead.
  head        a fresh linear classifier; --head-init probe starts it from a logistic regression on the
              frozen sentence vectors (LP-FT).
  SetFit      off. --setfit-steps N (single-sentence classification: SST-2, CoLA) first trains the encoder
              for N steps on SetFit's contrastive pairs (16 pairs of training sentences a step, same label
              -> cosine 1, different -> 0, lr 2e-5), then reads mean pooling with a head fitted by logistic
              regression on the tuned vectors, then fine-tunes as above; with --epochs 0 the probe-fitted
              head is the model (SetFit's own recipe). Not the default because, on SST-2 at 250 sentences,
              300 steps scored 81.8% / 70.1% (draws 0 / 1) against the defaults' 79.8% / 77.2%, at 3x
              the CPU (382 vs ~120 CPU s).
  (MiniLM, SST-2, no flag but --train, scored on 872 clean held-out sentences: 250 sentences 79.8% and
  77.2% (two draws), 1,000 sentences 85.0%, the full file 88.5% in one epoch. Measured and not made
  default, 250 sentences (draws 0 / 1): --pooling mean 79.1% / 72.5%, mean + --head-init probe --lr 3e-5
  75.2% / 76.5%, --lr 2e-4 - / 75.6%, --train-embeddings - / 69.6%. The README's fine-tuning section
  and experiments/fewlabel/RESULTS.md have the tables and commands.)
Writes the best model (config.json with id2label, model.safetensors, tokenizer files), metrics.jsonl
(the run) and metrics.json (the summary) into --output.
With --save-every N a training checkpoint goes to OUTPUT/checkpoints every N steps, and a killed run
continues exactly with --resume (other options than that run's are refused, naming the field).
Under torchrun each process takes its share of every batch
(--parallel ddp replicates the model, fsdp shards it; docs/DISTRIBUTED.md).

example:
  attnlab finetune mrpc --model minilm --output out/mrpc
  attnlab evaluate mrpc --model out/mrpc --data ../shared/data/glue/MRPC/dev.tsv
  torchrun --nproc_per_node=2 -m attnlab finetune sst2 --model minilm --output out/sst2 --parallel fsdp
"""
from __future__ import annotations

import argparse
import json
import sys

NAME = "finetune"
HELP = "fine-tune on a task (GLUE, CoNLL-2003, SQuAD); writes the model and metrics.json"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..tasks import TASK_NAMES
    p.add_argument("task", metavar="TASK", choices=(*TASK_NAMES, "translation"), help=", ".join((*TASK_NAMES, "translation")))
    p.add_argument("--model", help="pretrained model directory or packaged name (e.g. minilm); for translation a "
                                    "preset to train from scratch (default transformer-base) or a model directory")
    p.add_argument("--output", required=True, help="directory for the fine-tuned model and metrics")
    p.add_argument("--train", help="training file (default: the task's file under ATTNLAB_DATA; "
                                   "several files may be joined with commas)")
    p.add_argument("--valid", help="validation file (default: the task's dev file, or a held-out part of train)")
    p.add_argument("--epochs", type=float, help="passes over the training data (fractions allowed; default: the rule below)")
    p.add_argument("--lr", type=float, help="peak learning rate (default: the rule below)")
    p.add_argument("--batch-size", type=int, help="examples per step (default: the rule below)")
    p.add_argument("--max-length", type=int, help="tokens per input, longer ones are truncated (task default)")
    p.add_argument("--seed", type=int, default=42, help="random seed (default 42)")
    p.add_argument("--eval-every", type=int, help="also evaluate every N steps (default: each epoch end)")
    p.add_argument("--patience", type=int, help="stop after N evaluations without improvement")
    p.add_argument("--max-train-samples", type=int, help="train on a seeded random subset of this size")
    p.add_argument("--max-eval-samples", type=int, help="validate on a seeded random subset of this size")
    p.add_argument("--pooling", choices=("cls", "mean"),
                   help="sentence vector of a classifier: the pooled [CLS] (BERT) or the mean over tokens "
                        "(default: the rule below)")
    p.add_argument("--head-init", choices=("probe", "random"),
                   help="start the classifier from a logistic regression on the frozen sentence vectors "
                        "(probe, LP-FT) or at random (default: the rule below)")
    p.add_argument("--setfit-steps", type=_steps, metavar="N",
                   help="steps of SetFit contrastive pairs before the head (default 0: off; see SetFit below)")
    p.add_argument("--train-embeddings", action="store_true",
                   help="also update the word-embedding matrix (frozen by default: faster on CPU)")
    p.add_argument("--from-scratch", action="store_true",
                   help="same architecture and tokenizer as --model but random weights (the no-pretraining baseline)")
    p.add_argument("--lora", metavar="r=8[,alpha=16,dropout=0.05,targets=q+v]",
                   help="LoRA instead of full fine-tuning: only the adapters and the task head train; the adapter is "
                        "written to OUTPUT/adapter in peft's layout, the merged model to OUTPUT")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    p.add_argument("--save-every", type=int, default=0,
                   help="write a training checkpoint to OUTPUT/checkpoints every N steps (default: none)")
    p.add_argument("--resume", action="store_true",
                   help="continue exactly from the newest checkpoint in --output (a run killed mid-way)")
    p.add_argument("--parallel", choices=("ddp", "fsdp"), default="ddp",
                   help="under torchrun: replicate (ddp, default) or shard (fsdp) the model")
    t = p.add_argument_group("translation (attnlab.tasks.translation)")
    t.add_argument("--src-lang", help="source language code (recorded in config.json), e.g. en")
    t.add_argument("--tgt-lang", help="target language code, e.g. de")
    t.add_argument("--directions", metavar="SRC-TGT[,...]",
                   help="train ONE multilingual model on these directions between --src-lang and --tgt-lang, e.g. "
                        "en-de,de-en (M2M-100 style: a __de__ token starts the target; translate --target-lang de)")
    for name in ("train-src", "train-tgt", "valid-src", "valid-tgt"):
        t.add_argument(f"--{name}", help="parallel text file, one sentence per line")
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a preset field (JSON value), e.g. --set hidden_size=256 --set extra.num_decoder_layers=3")
    t.add_argument("--vocab-size", type=int, default=8000, help="joint BPE vocabulary size (default 8000)")
    t.add_argument("--max-tokens", type=int, default=4096, help="padded tokens per batch (default 4096)")
    t.add_argument("--max-minutes", type=float, help="stop training after this many minutes")
    t.add_argument("--warmup", type=int, help="warmup steps of the inverse square-root schedule (preset default)")
    t.add_argument("--lr-factor", type=float, default=1.0, help="multiplies the schedule (default 1.0)")
    t.add_argument("--eval-beams", type=int, default=1, help="beams when validating (default 1: greedy)")


def _steps(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value}: must be 0 (off) or more")
    return value


def run(args: argparse.Namespace) -> int:
    if args.save_every < 0:  # before any work (TrainArgs would refuse it only after the data is read)
        raise ValueError(f"--save-every {args.save_every}: must be 0 (no training checkpoints) or more")
    if args.task == "translation":
        if args.lora:
            raise ValueError("finetune translation: --lora is for the encoder tasks (and attnlab sft for decoders)")
        return _translation(args)
    if not args.model:
        raise ValueError(f"finetune {args.task}: --model is required")
    from ..tasks.finetune import finetune
    summary = finetune(args.task, args.model, args.output, train_file=args.train, valid_file=args.valid,
                       epochs=args.epochs, lr=args.lr, batch_size=args.batch_size, max_length=args.max_length,
                       seed=args.seed, eval_every=args.eval_every, patience=args.patience,
                       max_train_samples=args.max_train_samples, max_eval_samples=args.max_eval_samples,
                       freeze_embeddings=not args.train_embeddings, progress=args.progress,
                       from_scratch=args.from_scratch, save_every=args.save_every, resume=args.resume,
                       parallel=args.parallel, lora=_lora(args.lora), pooling=args.pooling, head_init=args.head_init,
                       setfit_steps=args.setfit_steps)
    print(json.dumps(summary))
    return 0


def _lora(spec: str | None) -> dict | None:
    from ..nn.lora import parse_lora_spec
    return parse_lora_spec(spec) if spec else None


def _translation(args: argparse.Namespace) -> int:
    from ..tasks.translation import finetune_translation
    if args.parallel != "ddp":
        raise ValueError("finetune translation: --parallel fsdp is not supported (its batches are not split "
                         "across processes); see docs/DISTRIBUTED.md")
    missing = [f"--{n}" for n in ("train-src", "train-tgt", "valid-src", "valid-tgt") if not getattr(args, n.replace("-", "_"))]
    if missing:
        raise ValueError(f"finetune translation: {', '.join(missing)} required")
    if args.directions:  # a bad direction is a usage error: one line, status 2, before any work
        from ..tasks.translation import LanguageError, parse_directions
        try:
            parse_directions(args.directions, args.src_lang or "", args.tgt_lang or "")
        except LanguageError as err:
            print(f"attnlab finetune: error: {err}", file=sys.stderr)
            return 2
    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    summary = finetune_translation(args.train_src, args.train_tgt, args.valid_src, args.valid_tgt, args.output,
                                   src_lang=args.src_lang or "src", tgt_lang=args.tgt_lang or "tgt",
                                   model=args.model or "transformer-base", overrides=overrides,
                                   vocab_size=args.vocab_size, max_tokens=args.max_tokens,
                                   max_length=args.max_length or 128, epochs=args.epochs or 30.0,
                                   max_minutes=args.max_minutes, warmup=args.warmup, lr_factor=args.lr_factor,
                                   eval_every=args.eval_every, eval_beams=args.eval_beams, seed=args.seed,
                                   max_eval_sentences=args.max_eval_samples, progress=args.progress,
                                   save_every=args.save_every, resume=args.resume, directions=args.directions)
    print(json.dumps(summary))
    return 0
