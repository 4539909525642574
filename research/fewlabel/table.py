"""The lever table of research/fewlabel/RESULTS.md from the harnesses' OUT/results.jsonl rows:

    python research/fewlabel/table.py /tmp/fewlabel/results.jsonl
"""
from __future__ import annotations

import json
import sys


def main(path: str) -> None:
    print("| labels | draw | flags beyond --train | schedule | score | wall s | CPU s | load (1-min, before/after) |")
    print("|---|---|---|---|---|---|---|---|")
    for line in open(path):
        r = json.loads(line)
        flags = r["command"].split("--no-progress")[-1].strip() or "(none)"
        score = r.get("clean_heldout_accuracy", r.get("valid_entity_f1"))
        sched = f"{r['steps']} steps, batch {r['batch_size']}, lr {r['lr']:g}" + (f", {r['pooling']}" if r.get("pooling") else "")
        print(f"| {r['n'] or 'all'} | {r['draw_seed']} | {flags} | {sched} | {score:.1f} | {r['finetune_wall_s']:.0f} | "
              f"{r.get('finetune_cpu_s', float('nan')):.0f} | {r['load_before'][0]:.1f} / {r['load_after'][0]:.1f} |")


if __name__ == "__main__":
    main(sys.argv[1])
