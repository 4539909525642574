#!/usr/bin/env bash
# SST-2 with all-MiniLM-L6-v2: LoRA r=8 vs full fine-tuning on the same 1,000 labeled sentences (draw 0 of
# research/fewlabel: whole sentences, none of the 872 clean held-out sentences or their phrases), scored
# on those 872 clean held-out sentences. Peak memory = max RSS of the finetune process (GNU time).
#   OMP_NUM_THREADS=1 bash research/lora/sst2_lora_vs_full.sh /tmp/lora_exp
set -euo pipefail
OUT=${1:-/tmp/lora_exp}
PY=${PY:-python}
mkdir -p "$OUT"
export OMP_NUM_THREADS=1
$PY "$(dirname "$0")/sst2_split.py" "$OUT"   # heldout-872.tsv, train-1000.tsv
run() {  # name, extra finetune flags...
  local name=$1; shift
  echo "load before $name: $(cat /proc/loadavg)"
  /usr/bin/time -v $PY -m attnlab finetune sst2 --model minilm --train "$OUT/train-1000.tsv" --output "$OUT/$name" \
      --no-progress "$@" > "$OUT/$name.json" 2> "$OUT/$name.log"
  echo "load after $name: $(cat /proc/loadavg)"
  $PY -m attnlab evaluate sst2 --model "$OUT/$name" --data "$OUT/heldout-872.tsv" > "$OUT/$name.eval.json"
  echo "$name: $(cat "$OUT/$name.eval.json") wall_time_s=$($PY -c "import json;print(json.load(open('$OUT/$name.json'))['wall_time_s'])")" \
       "max_rss_kb=$(grep 'Maximum resident' "$OUT/$name.log" | awk '{print $NF}')" \
       "trainable=$(grep -o '[0-9,]* trainable parameters of [0-9,]*' "$OUT/$name.log" || echo all)"
}
run lora-r8 --lora r=8,alpha=16 --lr 5e-4
run full
