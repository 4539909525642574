"""What a second `generate --compile` process pays (#22): seconds from process start to the first compiled
token, and new tokens/s at batch 1, SmolLM2-135M fp32 (dequantized), with inductor's weight packing on (as
attnlab ships it) and off (the setting under which torch 2.13's FX graph cache accepts the frozen graph).

    .venv/bin/python benchmarks/compile_start.py [--model smollm2] [--new-tokens 100]

Each setting gets its own fresh inductor cache directory; its first process compiles into it, its second
process starts from it. Every run is a fresh process, the settings take turns (on, off, on, off), so load
from other processes hits both alike. Prints one JSON line per run, then the table with the load average.
Not a test: the numbers depend on the machine and on what else runs on it.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def worker(model: str, prepack: bool, new_tokens: int) -> dict:
    t0 = time.perf_counter()
    from attnlab.inference import compiled  # before inductor's config: it picks no directory of its own here
    import torch
    from torch._dynamo.utils import counters

    import attnlab
    from attnlab.inference.generate import generate
    if not prepack:  # shipped: packing on; off lets the FX graph cache take the graph (module doc of compiled)
        patch = compiled.inductor_config.patch

        class _Config:
            @staticmethod
            def patch(*args, **kwargs):
                return patch(*args, **{**kwargs, "cpp.weight_prepack": False})
        compiled.inductor_config = _Config
    net = attnlab.load(model, quantized=False)
    tok = attnlab.load_tokenizer(model)
    ids = torch.tensor([tok.encode("Once upon a time, in a small village by the sea,")])
    limit = net.config.max_position_embeddings  # both calls must fall in one capacity bucket: one graph, compiled once
    if compiled.capacity_bucket(ids.size(1) + 2, limit) != compiled.capacity_bucket(ids.size(1) + new_tokens + 1, limit):
        sys.exit(f"--new-tokens {new_tokens}: the timed call would compile another capacity bucket; give fewer")
    load_s = time.perf_counter() - t0
    generate(net, ids, None, max_new_tokens=2, eos_token_id=[], compile=True)  # the prompt, one compiled step
    first = time.perf_counter() - t0
    t = time.perf_counter()
    out = generate(net, ids, None, max_new_tokens=new_tokens + 1, eos_token_id=[], compile=True)
    rate = new_tokens / (time.perf_counter() - t)
    return {"prepack": prepack, "threads": torch.get_num_threads(), "load_s": round(load_s, 1),
            "first_compiled_token_s": round(first, 1), "tok_s": round(rate, 1),
            "fx_cache": {k: counters["inductor"][f"fxgraph_cache_{k}"] for k in ("hit", "miss", "bypass")},
            "load_avg": round(os.getloadavg()[0], 2), "last_ids": out[0, -4:].tolist()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--new-tokens", type=int, default=100)
    ap.add_argument("--worker", choices=("on", "off"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.model, a.worker == "on", a.new_tokens)))
        return 0
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for turn in ("first", "second"):
            for setting in ("on", "off"):
                env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(Path(tmp) / setting))
                done = subprocess.run([sys.executable, __file__, "--worker", setting, "--model", a.model,
                                       "--new-tokens", str(a.new_tokens)], env=env, capture_output=True,
                                      text=True, cwd=REPO)
                if done.returncode:
                    sys.exit(f"worker {setting} ({turn}) failed:\n{done.stderr[-2000:]}")
                rows[setting, turn] = json.loads(done.stdout.strip().splitlines()[-1])
                print(json.dumps({"setting": setting, "process": turn, **rows[setting, turn]}), flush=True)
    print("\n| weight packing | first compiled token, fresh cache | second process | tokens/s (first / second) |")
    print("|---|---|---|---|")
    for setting in ("on", "off"):
        f, s = rows[setting, "first"], rows[setting, "second"]
        print(f"| {setting} | {f['first_compiled_token_s']} s | {s['first_compiled_token_s']} s "
              f"(FX cache hits {s['fx_cache']['hit']}) | {f['tok_s']} / {s['tok_s']} |")
    same = rows["on", "first"]["last_ids"] == rows["off", "first"]["last_ids"]
    print(f"\nsame greedy ids both ways: {same}; load average {rows['on', 'first']['load_avg']}-"
          f"{rows['off', 'second']['load_avg']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
