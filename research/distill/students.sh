#!/bin/sh
# Three 3-layer students of the SST-2 teacher (teacher.sh), on the same 16,000 training sentences
# (a seeded subset of train.tsv without the 872 held-out sentences and their phrases), 2 epochs of
# batches of 32, labels unused (--alpha-mlm 0: the teacher is the only supervision):
#   tinybert   192 wide, 12 heads: attention KL + projected hidden MSE on teacher layers 1,3,5 + embedding
#              MSE + soft targets (T=1); embeddings/pooler/classifier PCA-initialised, layers random; lr 3e-4
#   minilm     192 wide, 12 heads: last-layer attention KL + value relation + soft targets; same init; lr 3e-4
#   distilbert 384 wide: teacher layers 0,2,4 copied; soft targets (T=2, x5) + hidden cosine; lr 1e-4
# Each runs on one thread at nice 10, the three side by side; /usr/bin/time -v gives CPU seconds.
# RESULTS.md measures the step-500 checkpoints (end of epoch 1): the shared machine left too little time for 2.
set -e
OUT=${OUT:-/work/runs/distill}
N=${N:-16000}
export OMP_NUM_THREADS=1
common="--task sst2 --teacher $OUT/teacher --student-layers 3 --max-train-samples $N --epochs 2 --batch-size 32 \
        --alpha-mlm 0 --no-progress"
uptime
nice -n 10 /usr/bin/time -v python -m attnlab distill $common --student-width 192 --style tinybert --lr 3e-4 \
    --output "$OUT/tinybert" > "$OUT/tinybert.json" 2> "$OUT/tinybert.stderr" &
nice -n 10 /usr/bin/time -v python -m attnlab distill $common --student-width 192 --style minilm --lr 3e-4 \
    --output "$OUT/minilm" > "$OUT/minilm.json" 2> "$OUT/minilm.stderr" &
nice -n 10 /usr/bin/time -v python -m attnlab distill $common --style distilbert --lr 1e-4 \
    --output "$OUT/distilbert" > "$OUT/distilbert.json" 2> "$OUT/distilbert.stderr" &
wait
uptime
