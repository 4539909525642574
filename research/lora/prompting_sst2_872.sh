#!/usr/bin/env bash
# Zero/few-shot SST-2 by label log-probabilities with SmolLM2-135M-Instruct on all 872 clean held-out sentences,
# k in {0,1,4,8}, demonstrations drawn (seed + k) from the 1,000 whole training sentences of sst2_split.py.
# The k demonstrations are the same for every sentence of a k: their KV cache is computed once and both label
# words are read off one forward pass (tasks/prompting.py `label_scores`).
#   OMP_NUM_THREADS=1 bash research/lora/prompting_sst2_872.sh /tmp/prompt_exp [SEED]
set -euo pipefail
OUT=${1:-/tmp/prompt_exp}
SEED=${2:-0}
PY=${PY:-python}
export OMP_NUM_THREADS=1
$PY "$(dirname "$0")/sst2_split.py" "$OUT"
for K in 0 1 4 8; do   # one process per k: each k's result is kept as soon as it is done
  echo "k=$K load before: $(cat /proc/loadavg)"
  /usr/bin/time -v $PY -m attnlab evaluate-prompting --model smollm2 --data "$OUT/heldout-872.tsv" \
      --pool "$OUT/train-1000.tsv" --shots "$K" --seed "$SEED" > "$OUT/k$K-seed$SEED.json" 2> "$OUT/k$K-seed$SEED.log"
  echo "k=$K load after: $(cat /proc/loadavg)"
  cat "$OUT/k$K-seed$SEED.json"
  grep -E "Elapsed|User time|System time|Maximum resident" "$OUT/k$K-seed$SEED.log"
done
