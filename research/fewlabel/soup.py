"""A uniform "model soup" (Wortsman et al. 2022): the weights of K fine-tuned runs of the same checkpoint
averaged into one model, scored like any run. A lever for the few-label table: runs that differ only in
seed start from the same pretrained weights and stay close enough for their average to be a model.

    python research/fewlabel/soup.py --output /tmp/soup --data HELD.tsv RUN_DIR RUN_DIR [RUN_DIR ...]

Prints one JSON line: the accuracy of each run and of the soup on --data.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from timing import attnlab_json

STATE = "attnlab_state.safetensors"


def soup(dirs: list[Path], output: Path) -> None:
    missing = [str(d) for d in dirs if not (d / STATE).is_file()]
    if missing:
        raise SystemExit(f"soup: no {STATE} in {', '.join(missing)} (a finetune output in attnlab's own layout)")
    states = [load_file(str(d / STATE)) for d in dirs]
    keys = set(states[0])
    for d, s in zip(dirs, states):
        if set(s) != keys:
            raise SystemExit(f"soup: {d} has other weights than {dirs[0]} (a different head or pooling?)")
    avg = {k: (sum(s[k].double() for s in states) / len(states)).to(states[0][k].dtype)
           if states[0][k].is_floating_point() else states[0][k] for k in keys}
    if output.exists():
        shutil.rmtree(output)
    shutil.copytree(dirs[0], output, ignore=shutil.ignore_patterns(STATE, "checkpoints"))
    save_file({k: v.contiguous() for k, v in avg.items()}, str(output / STATE))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--output", type=Path, required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--task", default="sst2")
    a = ap.parse_args()
    if len(a.runs) < 2:
        ap.error("give at least two run directories")
    soup(a.runs, a.output)
    score = lambda d: attnlab_json(["evaluate", a.task, "--model", str(d), "--data", a.data])["accuracy"]
    row = {"runs": [str(d) for d in a.runs], "each": [score(d) for d in a.runs], "soup": score(a.output)}
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    sys.exit(main())
