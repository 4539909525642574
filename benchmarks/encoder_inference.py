"""Encoder inference, attnlab vs transformers (SDPA) side by side in one process, on the real
all-MiniLM-L6-v2 weights and real sentences.

Two workloads:
- realistic mix: SST-2 and CoNLL-2003 sentences in their file order, batches of 32. transformers pads
  each batch to its longest sentence (as a user's loop does); attnlab's `embed` sorts by length and runs
  unpadded. Reports sentences/s and the share of computed tokens that were padding.
- fixed shapes: 32 × 128 real tokens, no padding anywhere: pure kernel efficiency, in achieved GFLOP/s
  against a measured fp32 matmul ceiling.

usage: .venv/bin/python benchmarks/encoder_inference.py [--sentences 2048] [--threads N] [--bf16]
"""
from __future__ import annotations

import argparse
import csv
import sys
import time

import torch

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from _common import best_of, best_of_interleaved, data_root, table  # noqa: E402


def sentences(n: int) -> list[str]:
    root = data_root()
    with open(root / "glue" / "SST-2" / "train.tsv", encoding="utf-8") as fh:
        sst = [r[0] for r in list(csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]]
    conll, words = [], []
    for line in open(root / "conll2003" / "train.txt", encoding="utf-8"):
        if not line.strip():
            if words and words[0] != "-DOCSTART-":
                conll.append(" ".join(words))
            words = []
        else:
            words.append(line.split()[0])
    mixed = [s for pair in zip(sst, conll) for s in pair]  # interleave: lengths vary batch to batch
    return mixed[:n]


def matmul_ceiling(dtype=torch.float32) -> float:
    a, b = torch.randn(2048, 2048, dtype=dtype), torch.randn(2048, 2048, dtype=dtype)
    t = best_of(lambda: torch.mm(a, b), 5)
    return 2 * 2048 ** 3 / t / 1e9


def model_flops(cfg, tokens: int, seq: int) -> float:
    """Forward FLOPs of the encoder layers for `tokens` real tokens in sequences of length `seq`."""
    d, ff, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers
    linear = 2 * tokens * (4 * d * d + 2 * d * ff)
    attention = 2 * 2 * tokens * seq * d
    return layers * (linear + attention)


@torch.inference_mode()
def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sentences", type=int, default=2048)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--bf16", action="store_true", help="also run attnlab with bf16 weights/activations")
    p.add_argument("--int8", action="store_true", help="also run attnlab in int8: per-token int8 + SmoothQuant "
                                                       "(attnlab.inference.quantize; ONNX Runtime: cpu_engines.py)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    import attnlab
    from attnlab.inference.embed import embed
    from attnlab.interop.local import resolve

    path = resolve("sentence-transformers/all-MiniLM-L6-v2")
    ours, tok = attnlab.load(path), attnlab.load_tokenizer(path)
    theirs = transformers.BertModel.from_pretrained(path, attn_implementation="sdpa").eval()
    texts = sentences(args.sentences)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, {len(texts)} real sentences, batch 32")

    # --- realistic mix
    def hf_run():
        out = []
        for i in range(0, len(texts), 32):
            b = tok(texts[i:i + 32], padding=True, return_tensors="pt")
            h = theirs(**b).last_hidden_state
            m = b["attention_mask"].unsqueeze(-1).float()
            out.append(torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1))
        return torch.cat(out)

    real = padded = 0
    for i in range(0, len(texts), 32):
        b = tok(texts[i:i + 32], padding=True, return_tensors="pt")
        real += int(b["attention_mask"].sum())
        padded += b["attention_mask"].numel()
    # attnlab's share: embed sorts by length; a batch runs unpadded (no padding work) unless its padding
    # is below the encoder's unpad_min_padding, in which case it runs padded
    lengths = sorted(len(x) for x in tok(texts, truncation=True)["input_ids"])
    ours_computed = 0
    for i in range(0, len(lengths), 32):
        batch = lengths[i:i + 32]
        full = len(batch) * max(batch)
        ours_computed += full if 1 - sum(batch) / full < getattr(ours, "backbone", ours).unpad_min_padding \
            else sum(batch)
    ours_padding = f"{1 - real / ours_computed:.0%}"
    ref = hf_run()
    mine = torch.from_numpy(embed(ours, tok, texts, batch_size=32, progress=False))
    cos = (ref * mine).sum(-1).min().item()
    times = best_of_interleaved({"hf": hf_run,
                                 "ours": lambda: embed(ours, tok, texts, batch_size=32, progress=False)}, 4)
    t_hf, t_ours = times["hf"], times["ours"]
    rows = [["transformers (sdpa)", f"{len(texts) / t_hf:.1f}", "1.00", f"{1 - real / padded:.0%}", "-"],
            ["attnlab fp32", f"{len(texts) / t_ours:.1f}", f"{t_hf / t_ours:.2f}", ours_padding, f"{cos:.6f}"]]
    if args.bf16:
        ours_bf16 = attnlab.load(path, dtype=torch.bfloat16)
        vb = torch.from_numpy(embed(ours_bf16, tok, texts, batch_size=32, progress=False))
        t_b = best_of(lambda: embed(ours_bf16, tok, texts, batch_size=32, progress=False), 2)
        rows.append(["attnlab bf16", f"{len(texts) / t_b:.1f}", f"{t_hf / t_b:.2f}", ours_padding,
                     f"{(ref * vb).sum(-1).min().item():.6f}"])
    if args.int8:
        from attnlab.inference.quantize import calibration_batches, quantize
        ours_int8 = quantize(ours, "int8", calibration=calibration_batches(tok))
        v8 = torch.from_numpy(embed(ours_int8, tok, texts, batch_size=32, progress=False))
        t_8 = best_of(lambda: embed(ours_int8, tok, texts, batch_size=32, progress=False), 2)
        rows.append(["attnlab int8", f"{len(texts) / t_8:.1f}", f"{t_hf / t_8:.2f}", ours_padding,
                     f"{(ref * v8).sum(-1).min().item():.6f} (mean {(ref * v8).sum(-1).mean().item():.4f})"])
    print(f"targets: fp32 >= 2.5x transformers (got {t_hf / t_ours:.2f}x)"
          + (f"; bf16 >= 4x with min cos >= 0.999 (got {t_hf / t_b:.2f}x)" if args.bf16 else ""))
    print("\nrealistic mix (sentences/s; ratio vs transformers; padding share of computed tokens; min cosine to transformers)")
    print(table(rows, ["engine", "sent/s", "ratio", "padding", "min cos"]))

    # --- fixed shapes: 32 x 128 real tokens
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 30000, (32, 128), generator=g)
    mask = torch.ones_like(ids)
    flops = model_flops(ours.config, 32 * 128, 128)
    ceiling = matmul_ceiling()
    times = best_of_interleaved({"hf": lambda: theirs(input_ids=ids, attention_mask=mask),
                                 "ours": lambda: ours(input_ids=ids, attention_mask=mask)}, 6)
    t_hf, t_ours = times["hf"], times["ours"]
    rows = [["transformers (sdpa)", f"{t_hf * 1000:.0f}", f"{flops / t_hf / 1e9:.0f}", f"{flops / t_hf / 1e9 / ceiling:.0%}", "1.00"],
            ["attnlab fp32", f"{t_ours * 1000:.0f}", f"{flops / t_ours / 1e9:.0f}", f"{flops / t_ours / 1e9 / ceiling:.0%}", f"{t_hf / t_ours:.2f}"]]
    if args.int8:
        t_8 = best_of(lambda: ours_int8(input_ids=ids, attention_mask=mask), 3)
        rows.append(["attnlab int8", f"{t_8 * 1000:.0f}", f"{flops / t_8 / 1e9:.0f}", "-", f"{t_hf / t_8:.2f}"])
    print(f"\nfixed 32×128 batch (target attnlab fp32 >= 1.0x transformers: got {t_hf / t_ours:.2f}x)")
    print(f"fixed 32×128 batch (fp32 matmul ceiling measured: {ceiling:.0f} GFLOP/s)")
    print(table(rows, ["engine", "ms/batch", "GFLOP/s", "of ceiling", "ratio"]))


if __name__ == "__main__":
    main()
