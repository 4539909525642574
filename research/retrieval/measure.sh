#!/bin/sh
# Dense vs ColBERT-style retrieval on the SQuAD dev paragraphs (../shared/data/squad/dev.json: 10 train articles
# held out of train*.json, 419 paragraphs, 1,953 questions; the official dev set is not in the data).
# usage: research/retrieval/measure.sh MODEL TAG [KINDS]   (KINDS default "dense colbert"; outputs under $RUNS,
#        default /work/runs/retrieval)
# Each step logs `uptime` before/after and /usr/bin/time -v (CPU seconds) next to its JSON.
set -eu
MODEL=$1; TAG=$2; KINDS=${3:-dense colbert}
RUNS=${RUNS:-/work/runs/retrieval}
DATA=${ATTNLAB_DATA:-../shared/data}
PY=${PY:-python}
mkdir -p "$RUNS"
for KIND in $KINDS; do
  OUT="$RUNS/$TAG-$KIND"
  uptime > "$OUT.log"
  /usr/bin/time -v -a -o "$OUT.log" $PY -m attnlab index "$DATA/squad/dev.json" --model "$MODEL" --kind "$KIND" \
      --output "$OUT.idx" >> "$OUT.log" 2>&1
  uptime >> "$OUT.log"
  /usr/bin/time -v -a -o "$OUT.log" $PY -m attnlab search "$OUT.idx" --squad "$DATA/squad/dev.json" > "$OUT.json"
  uptime >> "$OUT.log"
  cat "$OUT.json"
done
