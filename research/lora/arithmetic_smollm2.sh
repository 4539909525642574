#!/usr/bin/env bash
# Direct vs chain-of-thought vs self-consistency with SmolLM2-135M-Instruct on generated two-step arithmetic
# word problems (attnlab/tasks/reasoning.py): 3 worked examples, 30 problems, 5 sampled paths at temperature 0.7.
#   OMP_NUM_THREADS=1 bash research/lora/arithmetic_smollm2.sh /tmp/arith_exp
set -euo pipefail
OUT=${1:-/tmp/arith_exp}
PY=${PY:-python}
export OMP_NUM_THREADS=1
mkdir -p "$OUT"
for MODE in direct cot self-consistency; do   # one process per mode: each result is kept as soon as it is done
  echo "$MODE load before: $(cat /proc/loadavg)"
  /usr/bin/time -v $PY -m attnlab evaluate-prompting --model smollm2 --task arithmetic --mode $MODE --problems 30 \
      --shots 3 --samples 5 --temperature 0.7 --max-new-tokens 64 --batch-size 16 --seed 0 \
      --output "$OUT/$MODE.json" > "$OUT/$MODE.summary.json" 2> "$OUT/$MODE.log"
  echo "$MODE load after: $(cat /proc/loadavg)"
  cat "$OUT/$MODE.summary.json"
  grep -E "Elapsed|User time|System time|Maximum resident" "$OUT/$MODE.log"
done
