"""What a second `generate --compile` process pays: seconds from process start to the first compiled
token, and new tokens/s at batch 1, SmolLM2-135M fp32 (dequantized), for
- `package` (as shipped): the step is an AOTInductor package (inference/aot.py); the first process compiles
  and saves it under $ATTNLAB_CACHE/compiled, the second loads it;
- `jit`: the step compiled in-process by torch.compile (`StaticDecoder(persist=False)`, the earlier
  default), with inductor's own on-disk caches (which refuse the frozen graph's packed weights);
and, for scale, the two eager paths: fp32 on the dequantized weights, and the GGUF file's own blocks
(`attnlab.load(..., quantized=True)`, the default for a .gguf).

    .venv/bin/python benchmarks/compile_start.py [--model smollm2] [--new-tokens 100]

Each compiled setting gets its own fresh cache directories; its first process compiles into them, its
second process starts from them. Every run is a fresh process and the settings take turns, so load from
other processes hits both alike. Prints one JSON line per run, then the table with the load average.
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
SETTINGS = ("package", "jit", "eager", "gguf")


def worker(model: str, setting: str, new_tokens: int) -> dict:
    t0 = time.perf_counter()
    import torch

    import attnlab
    from attnlab.inference import aot, compiled
    from attnlab.inference.generate import generate
    net = attnlab.load(model, quantized=setting == "gguf")
    tok = attnlab.load_tokenizer(model)
    ids = torch.tensor([tok.encode("Once upon a time, in a small village by the sea,")])
    compile = setting in ("package", "jit")
    if setting == "jit":
        compiled._DECODERS[net] = compiled.StaticDecoder(net, persist=False)
    load_s = time.perf_counter() - t0
    generate(net, ids, None, max_new_tokens=2, eos_token_id=[], compile=compile)  # the prompt, one step
    first = time.perf_counter() - t0
    t = time.perf_counter()
    out = generate(net, ids, None, max_new_tokens=new_tokens + 1, eos_token_id=[], compile=compile)
    rate = new_tokens / (time.perf_counter() - t)
    return {"threads": torch.get_num_threads(), "load_s": round(load_s, 1),
            "first_token_s": round(first, 1), "tok_s": round(rate, 1), "packages": dict(aot.counts),
            "load_avg": round(os.getloadavg()[0], 2), "ids": out[0, ids.size(1):].tolist()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--new-tokens", type=int, default=100)
    ap.add_argument("--worker", choices=SETTINGS, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.model, a.worker, a.new_tokens)))
        return 0
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for turn in ("first", "second"):
            for setting in SETTINGS:
                if turn == "second" and setting in ("eager", "gguf"):
                    continue  # nothing to cache
                env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(Path(tmp) / setting / "inductor"),
                           ATTNLAB_CACHE=str(Path(tmp) / setting / "attnlab"))
                done = subprocess.run([sys.executable, __file__, "--worker", setting, "--model", a.model,
                                       "--new-tokens", str(a.new_tokens)], env=env, capture_output=True,
                                      text=True, cwd=REPO)
                if done.returncode:
                    sys.exit(f"worker {setting} ({turn}) failed:\n{done.stderr[-2000:]}")
                rows[setting, turn] = json.loads(done.stdout.strip().splitlines()[-1])
                print(json.dumps({"setting": setting, "process": turn, **rows[setting, turn]}), flush=True)
    print("\n| path | first token, fresh process and cache | second process | new tokens/s (first / second) |")
    print("|---|---|---|---|")
    for setting in SETTINGS:
        f, s = rows[setting, "first"], rows.get((setting, "second"))
        second = f"{s['first_token_s']} s" if s else "-"
        rates = f"{f['tok_s']} / {s['tok_s']}" if s else f"{f['tok_s']}"
        print(f"| {setting} | {f['first_token_s']} s | {second} | {rates} |")
    base = rows["eager", "first"]["ids"]
    for setting in SETTINGS:
        ids = rows[setting, "first"]["ids"]
        agree = next((i for i, (x, y) in enumerate(zip(ids, base)) if x != y), len(base))
        print(f"{setting}: greedy ids equal to eager fp32 for the first {agree} of {len(base)} tokens")
    print(f"load average {rows['package', 'first']['load_avg']}-{rows['package', 'second']['load_avg']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
