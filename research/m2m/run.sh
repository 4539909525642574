#!/bin/sh
# The three runs of two_way.py side by side, each on one thread at low priority (the machine is shared),
# with its CPU seconds (/usr/bin/time -v) and the load before and after. Then the table.
#   sh research/m2m/run.sh        (from the repository root; OUT=/work/runs/m2m by default)
OUT=${OUT:-/work/runs/m2m}
export OUT OMP_NUM_THREADS=1
mkdir -p "$OUT"
PY=${PY:-python}
here=$(dirname "$0")
uptime | tee "$OUT/load-start.txt"
for run in en-de de-en two-way; do
    nice -n 10 /usr/bin/time -v "$PY" "$here/two_way.py" train $run > "$OUT/$run.stdout" 2> "$OUT/$run.stderr" &
done
wait
uptime | tee "$OUT/load-end.txt"
grep -H "User time\|System time\|Elapsed" "$OUT"/*.stderr
"$PY" "$here/two_way.py" table | tee "$OUT/table.md"
