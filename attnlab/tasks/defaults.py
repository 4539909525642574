"""The defaults of `attnlab finetune` that follow the data: how much of a training file is held
out for validation, the schedule for small data, and the few-label rule (SetFit's recipe below SETFIT_BELOW
examples on a sentence-transformers checkpoint). One rule, documented in `finetune --help`; every number
here was measured (research/fewlabel/RESULTS.md, docs/research/fine-tuning-sst2.md)."""
from __future__ import annotations

import math

# At most this share of a training file is carved out for validation when no validation file is given:
# SST-2's fixed 872 sentences took 44% of a 2,000-line file and left too little to learn from.
MAX_HOLDOUT_SHARE = 0.10
DEFAULT_HOLDOUT = 872   # the size of SST-2's real dev set, for a large file without a validation file
# The size-adaptive default: a small training set still gets at least MIN_STEPS optimizer steps (more
# epochs, up to MAX_EPOCHS) in batches of SMALL_BATCH (below TINY_DATA at a peak lr of at least SMALL_LR).
# 32 steps at lr 5e-5 left MiniLM at chance on SST-2 from 1,000 examples; see research/fewlabel/
# and docs/research/fine-tuning-sst2.md for the measurements.
MIN_STEPS = 300
MAX_EPOCHS = 30
SMALL_DATA = 2000   # fewer training examples than this train in batches of SMALL_BATCH
SMALL_BATCH = 16
# fewer training examples than TINY_DATA get a peak lr of at least SMALL_LR. Measured on SST-2 (300-342
# steps): 225 examples 79.8% / 77.2% at 1e-4 vs 76.4% / 63.1% at 5e-5 (two draws); 900 examples 83.1%
# at 1e-4 vs 85.0% at 5e-5 (one draw).
TINY_DATA = 500
SMALL_LR = 1e-4
# Fewer training examples than SETFIT_BELOW (single-sentence classification on a sentence-transformers
# checkpoint, nothing chosen by hand) get SetFit's own recipe: SETFIT_STEPS steps of contrastive pairs
# (tasks/setfit.py, every pair within a batch), mean pooling, a probe-fitted head, no fine-tuning after and
# no hold-out (nothing is selected). SST-2, 250 sentences: 83.3% / 81.4% / 81.4% (draws 0 / 1 / 2); the
# plain fine-tune: 79.8% / 77.2% (draws 0 / 1); with 25 held out it was 82.6% / 78.2%, at 300 steps on all 250 82.7% / 79.8%
# (research/fewlabel/RESULTS.md). At 1,000 the plain fine-tune is the one measured best (84.6-85.0%; SetFit
# head-only 83.1%).
SETFIT_BELOW = 500
# The LM teacher (tasks/prompt_teacher.py): SmolLM2-135M, cut to its bottom TEACHER_LAYERS of 30 layers, fine-tuned
# as a prompt classifier (TEACHER_EPOCHS at TEACHER_LR, batches of 16, label smoothing TEACHER_SMOOTH), labels
# TEACHER_COPIES augmented copies of each sentence (data/augment.py); the student trains STUDENT_EPOCHS in batches of
# 16 on the sentences and the copies, on (1 - TEACHER_KD) x the labels' loss + TEACHER_KD x the teacher's soft
# targets at T = TEACHER_T, in bf16 where it trains faster. The default rule for SETFIT_BELOW to TEACHER_BELOW examples
# of SST-2 on a sentence-transformers checkpoint with nothing chosen by hand, when SmolLM2 is installed
# (research/fewlabel/RESULTS.md): at 900 SST-2 sentences 85.05 over nine runs in 249-272 s of two
# AVX512-BF16 cores (476 s on two AVX2-only cores, all fp32; 84.75 without the smoothing; the plain
# fine-tune 83.89 in ~86 s). The whole teacher (30 layers, lr 3e-5) scored 85.49 but took ~460 s; 12 layers fell
# to 67% on SST-2, one teacher epoch instead of two scored 84.62 in ~200 s.
TEACHER_BELOW = SMALL_DATA
TEACHER_EPOCHS = 2.0
TEACHER_LR = 1e-4        # the cut teacher starts further from a good classifier: at 3e-5, 87.3 on draw 1
TEACHER_FREEZE = 0.0     # the share of the teacher's (bottom) layers frozen
TEACHER_SMOOTH = 0.1     # the teacher's label smoothing: its logits on the copies stay soft (+0.28 over 9 runs)
TEACHER_LAYERS = 15      # the teacher keeps its bottom this many layers (0: all)
TEACHER_COPIES = 7
TEACHER_COPIES_LONG = 15  # sentences of at least this many words get one copy more
TEACHER_KD = 0.9
TEACHER_T = 2.0
STUDENT_EPOCHS = 1.0
# The full-file LM-teacher recipe (`finetune --teacher MODEL` on TEACHER_BELOW examples or more): the teacher is
# fine-tuned on every training example and gives each its logits (no augmented copies: on the full SST-2 file they
# cost the student 0.6); the student learns from labels + soft targets. Each number is the measured run's
# (docs/research/fine-tuning-sst2.md, "a distilled MiniLM": 91.08 over six seeds on the 872 held-out sentences).
FULL_TEACHER_EPOCHS = 0.6             # teacher epochs (llm_teacher.py --epochs 0.6; docs/research/fine-tuning-sst2.md)
FULL_TEACHER_LR = 1e-4                # teacher peak lr (--lr 1e-4; docs/research/fine-tuning-sst2.md)
FULL_TEACHER_LAYERS = 15              # the teacher's bottom layers kept (--keep-layers 15; docs/research/fine-tuning-sst2.md)
FULL_TEACHER_BATCH = 32               # teacher batch (llm_teacher.py's default 32; docs/research/fine-tuning-sst2.md)
FULL_TEACHER_SMOOTH = 0.0             # teacher label smoothing (llm_teacher.py's default 0; docs/research/fine-tuning-sst2.md)
FULL_TEACHER_KD = 0.9                 # the soft targets' share of the student's loss (kd 0.9; docs/research/fine-tuning-sst2.md)
FULL_TEACHER_T = 2.0                  # the soft targets' temperature (levers.py's T = 2; docs/research/fine-tuning-sst2.md)
FULL_TEACHER_STUDENT_EPOCHS = 3.0     # student epochs (kw epochs 3; docs/research/fine-tuning-sst2.md)
FULL_TEACHER_EMA = 0.999              # the student's weight average (kw ema 0.999; docs/research/fine-tuning-sst2.md)
FULL_TEACHER_FREEZE_EMBEDDINGS = False  # the student trains its word embeddings (docs/research/fine-tuning-sst2.md)
# --compile pads every batch to a multiple of this many tokens: SST-2's lengths then give ~4 shapes to compile
COMPILE_PAD = 32
SETFIT_STEPS = 600


def holdout_size(n_examples: int, preferred: int) -> int:
    """How many of `n_examples` training examples to hold out for validation: the task's `preferred` size
    (SST-2: 872, the size of its real dev set) when that is at most 10% of the file, else 10% (at least 1)."""
    cap = max(1, int(n_examples * MAX_HOLDOUT_SHARE))
    return min(preferred, cap)


def default_schedule(n_train: int, epochs: float, batch_size: int, lr: float, *, epochs_given: bool = False,
                     batch_given: bool = False, lr_given: bool = False) -> tuple[float, int, float]:
    """(epochs, batch_size, lr) for `n_train` training examples, starting from the task's defaults; what
    the caller set explicitly is kept. Small data gets batches of SMALL_BATCH (tiny data a peak learning
    rate of at least SMALL_LR) and enough epochs for MIN_STEPS optimizer steps (at most MAX_EPOCHS): the step count,
    not the epoch count, is what moves the model."""
    small = n_train < SMALL_DATA
    if not batch_given and small:
        batch_size = min(batch_size, SMALL_BATCH)
    if not lr_given and n_train < TINY_DATA:
        lr = max(lr, SMALL_LR)
    if not epochs_given:
        steps_per_epoch = max(1, math.ceil(n_train / batch_size))
        epochs = max(epochs, min(MAX_EPOCHS, math.ceil(MIN_STEPS / steps_per_epoch)))
    return epochs, batch_size, lr


def default_setfit_steps(n_train: int, applies: bool, below: int = SETFIT_BELOW) -> tuple[int, str]:
    """(SetFit contrastive steps, why) for `n_train` training examples: SETFIT_STEPS below `below` examples
    (0: never); `applies`: single-sentence classification on a sentence-transformers checkpoint with nothing
    chosen by hand (SetFit's ground, the case measured)."""
    if not applies:
        return 0, "it applies to single-sentence classification on a sentence-transformers checkpoint"
    if not below:
        return 0, "off"
    if n_train < below:
        return SETFIT_STEPS, f"{n_train} training examples < {below}"
    return 0, f"{n_train} training examples >= {below}"


def teacher_helps(n_train: int, applies: bool) -> bool:
    """Whether `finetune --teacher` was measured to help here: `n_train` training examples from SETFIT_BELOW to
    below TEACHER_BELOW; `applies`: single-sentence classification with a task prompt on a sentence-transformers
    checkpoint, nothing chosen by hand."""
    return applies and SETFIT_BELOW <= n_train < TEACHER_BELOW
