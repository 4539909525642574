"""SmolLM2-135M (the packaged Q4_1 GGUF) perplexity on WikiText-2 valid: attnlab beside transformers (same
windows, same threads, timed batch by batch in turns in one process) and, when its binary is given,
llama.cpp's `llama-perplexity`; then the cost of each precision attnlab can run the model in.

  OMP_NUM_THREADS=1 python benchmarks/lm_perplexity.py [--chars N] [--context 512] [--stride 256]
      [--convention hf|llama.cpp] [--llama-perplexity PATH | env LLAMA_PERPLEXITY] [--quant]

llama.cpp is not built or fetched here: pass the path of a `llama-perplexity` you built (the cmake target
beside llama-bench). Without it the llama.cpp column is skipped, and the script says so.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._common import data_root, table  # noqa: E402

import attnlab  # noqa: E402
from attnlab.inference.quantize import quantize  # noqa: E402
from attnlab.interop.local import resolve  # noqa: E402
from attnlab.tasks.lm import adds_bos, hf_windows, llama_cpp_windows, window_nll  # noqa: E402


def hf_nll(model, batch) -> tuple[float, int]:
    """transformers on the same windows: logits for the scored tail only (logits_to_keep), NLL summed."""
    ids = torch.tensor([w.ids for w in batch])
    keep = max(w.scored for w in batch) + 1
    with torch.no_grad():
        logits = model(ids, logits_to_keep=keep).logits.float()
    total, count = 0.0, 0
    for r, w in enumerate(batch):
        lp = torch.log_softmax(logits[r, -(w.scored + 1):-1], -1)
        total -= lp.gather(1, ids[r, w.score_from:, None]).sum().double().item()
        count += w.scored
    return total, count


def batches(windows, size):
    by_len: dict[int, list] = {}
    for w in windows:
        by_len.setdefault(len(w.ids), []).append(w)
    return [g[i:i + size] for g in by_len.values() for i in range(0, len(g), size)]


def llama_cpp(binary: str, gguf: Path, text_file: Path, n_ctx: int, threads: int) -> tuple[float, float] | None:
    """(perplexity, tokens/s) from llama-perplexity's output, or None when it fails (its output shown)."""
    cmd = [binary, "-m", str(gguf), "-f", str(text_file), "-c", str(n_ctx), "-b", str(n_ctx), "-t", str(threads)]
    run = subprocess.run(cmd, capture_output=True, text=True)
    out = run.stdout + run.stderr
    ppl = re.search(r"Final estimate: PPL = ([0-9.]+)", out)
    speed = re.search(r"prompt eval time =.*?([0-9.]+) tokens per second", out)
    if run.returncode or not ppl:
        print(f"llama-perplexity failed ({' '.join(cmd)}):\n{out[-2000:]}", file=sys.stderr)
        return None
    return float(ppl.group(1)), float(speed.group(1)) if speed else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--chars", type=int, help="only the first N characters of valid.txt (default: all of it)")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--stride", type=int, help="hf convention (default context/2)")
    p.add_argument("--convention", choices=("hf", "llama.cpp"), default="hf")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--llama-perplexity", default=os.environ.get("LLAMA_PERPLEXITY"))
    p.add_argument("--quant", action="store_true", help="also the precision table (fp32, int8)")
    args = p.parse_args()
    threads = torch.get_num_threads()
    import transformers

    gguf = resolve("smollm2")
    text = (data_root() / "wikitext-2" / "valid.txt").read_text(encoding="utf-8")[:args.chars]
    ours, tok = attnlab.load(gguf), attnlab.load_tokenizer(gguf)
    hf = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                           dtype=torch.float32).eval()
    ids = tok.encode(text)
    if args.convention == "hf":
        windows = hf_windows(ids, args.context, args.stride or args.context // 2)
    else:
        windows = llama_cpp_windows(ids, args.context, tok.bos_token_id if adds_bos(tok) else None)
    fed = sum(len(w.ids) for w in windows)
    print(f"{len(text)} chars, {len(ids)} tokens, {len(windows)} windows ({args.convention}, context "
          f"{args.context}), {fed} tokens fed, {threads} thread(s); load: {os.getloadavg()}", flush=True)

    sums = {"attnlab": [0.0, 0, 0.0], "transformers": [0.0, 0, 0.0]}
    for i, batch in enumerate(batches(windows, args.batch_size)):  # in turns, so a slow spell hits both
        order = [("attnlab", lambda b: window_nll(ours, b, batch_size=len(b))), ("transformers", lambda b: hf_nll(hf, b))]
        for name, fn in (order if i % 2 == 0 else order[::-1]):
            start = time.perf_counter()
            nll, n = fn(batch)
            sums[name][0] += nll
            sums[name][1] += n
            sums[name][2] += time.perf_counter() - start
    rows = [[name, n, f"{math.exp(nll / n):.4f}", f"{sec:.1f}", f"{fed / sec:.0f}", f"{sums['transformers'][2] / sec:.2f}x"]
            for name, (nll, n, sec) in sums.items()]
    if args.llama_perplexity and Path(args.llama_perplexity).is_file():
        with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8", delete=False) as f:
            f.write(text)
        got = llama_cpp(args.llama_perplexity, gguf, Path(f.name), args.context, threads)
        if got:
            rows.append(["llama.cpp (llama-perplexity)", "", f"{got[0]:.4f}", "", f"{got[1]:.0f}", ""])
    else:
        print("llama.cpp column skipped: no llama-perplexity binary (--llama-perplexity PATH or LLAMA_PERPLEXITY)")
    print(table(rows, ["", "scored", "perplexity", "seconds", "tokens fed/s", "speed vs transformers"]))
    print(f"load after: {os.getloadavg()}")

    if args.quant:
        fp32_nll, n = sums["attnlab"][:2]
        fp32_mb = sum(t.numel() * 4 for t in ours.parameters()) / 1e6  # parameters(): a tied weight once
        rows = [["Q4_1 GGUF as stored (attnlab cannot run it kept quantized yet, #22)",
                 f"{gguf.stat().st_size / 1e6:.1f}", "-", "-"],
                ["Q4_1 GGUF dequantized to fp32", f"{fp32_mb:.1f}", f"{math.exp(fp32_nll / n):.4f}", "0.00%"]]
        int8 = quantize(ours, "int8")
        with tempfile.TemporaryDirectory() as tmp:
            torch.save(int8.state_dict(), Path(tmp) / "int8.pt")
            size = (Path(tmp) / "int8.pt").stat().st_size
        nll, n = window_nll(int8, windows, batch_size=args.batch_size)
        ppl = math.exp(nll / n)
        rows.append(["attnlab int8 (dynamic, per-channel; ffn.down fp32)", f"{size / 1e6:.1f}", f"{ppl:.4f}",
                     f"{100 * (ppl / math.exp(fp32_nll / n) - 1):+.2f}%"])
        print(table(rows, ["precision", "size MB", "perplexity", "vs fp32"]))
        print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
