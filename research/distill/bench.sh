#!/bin/sh
# Teacher vs the students of students.sh: accuracy on the 872 clean held-out SST-2 sentences and sentences
# per CPU-second (one thread, best of 3, interleaved), at nice 10 on the shared machine. distilbert-init is the
# DistilBERT-style student before any distillation (teacher layers 0,2,4 copied): its starting accuracy.
set -e
OUT=${OUT:-/work/runs/distill}
export OMP_NUM_THREADS=1
uptime
nice -n 10 /usr/bin/time -v python benchmarks/distilled_speed.py "$OUT/teacher" "$OUT/tinybert" "$OUT/minilm" \
    "$OUT/distilbert" "$OUT/distilbert-init" --threads 1 --repeats 3 2> "$OUT/bench.stderr"
uptime
