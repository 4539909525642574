#!/bin/sh
# The teacher: all-MiniLM-L6-v2 (6 layers, 384 wide, 12 heads) fine-tuned on 1,000 SST-2 labels (seed 42),
# scored on the 872 clean held-out sentences. One thread, low priority (the machine is shared).
set -e
OUT=${OUT:-/work/runs/distill}
export OMP_NUM_THREADS=1
uptime
nice -n 10 /usr/bin/time -v python -m attnlab finetune sst2 --model minilm --output "$OUT/teacher" \
    --max-train-samples 1000 --no-progress 2> "$OUT/teacher.stderr"
uptime
