"""One two-way model (en->de and de->en, M2M-100-style language tokens) against two one-direction models on
Multi30k, at the same training budget (issue 23, "multilingual translation with a language prefix").

Every run: the original-Transformer preset made small for a loaded 2-core machine (d_model 128, 2 + 2
layers, 4 heads, FFN 512, joint BPE 8k), batches of 2,048 padded tokens, warmup 100, lr factor 0.2 (peak
1.8e-3), one thread. The singles train STEPS steps each; the two-way model trains 2 x STEPS steps on the
mixed directions: the same total compute as the two singles combined (the fair comparison). Every run is
scored every STEPS/2 steps, so the table also has the half budget, and the two-way model after as many steps
as one single (half the compute). Greedy sacreBLEU on the 1,014 Multi30k validation pairs each way.

    python research/m2m/two_way.py train en-de      # one run (run.sh starts the three side by side)
    python research/m2m/two_way.py table             # RESULTS table from the runs' metrics
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

STEPS = int(os.environ.get("STEPS", 240))
OUT = Path(os.environ.get("OUT", "/work/runs/m2m"))
DATA = Path(os.environ.get("ATTNLAB_DATA", "/work/shared/data")) / "multi30k"
MODEL = {"hidden_size": 128, "num_layers": 2, "num_heads": 4, "intermediate_size": 512}
RUNS = {"en-de": ("en", "de", None, STEPS), "de-en": ("de", "en", None, STEPS),
        "two-way": ("en", "de", "en-de,de-en", 2 * STEPS)}


def train(name: str) -> dict:
    from attnlab.tasks.translation import finetune_translation
    src, tgt, directions, steps = RUNS[name]
    return finetune_translation(DATA / f"train.{src}", DATA / f"train.{tgt}", DATA / f"val.{src}", DATA / f"val.{tgt}",
                                OUT / name, src_lang=src, tgt_lang=tgt, model="transformer-base", overrides=MODEL,
                                vocab_size=8000, max_tokens=2048, max_steps=steps, warmup=100, lr_factor=0.2,
                                eval_every=STEPS // 2, eval_beams=1, seed=42, threads=1, progress=False, log_every=20,
                                directions=directions)


def table() -> str:
    def evals(name: str) -> dict[int, dict]:
        path = OUT / name / "metrics.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
        return {r["step"]: r for r in rows if "eval_bleu" in r}
    single = {n: evals(n) for n in ("en-de", "de-en")}
    two = evals("two-way")
    lines = ["| budget (steps of 2,048 tokens) | en->de: single | en->de: two-way | de->en: single | de->en: two-way |",
             "|---|---|---|---|---|"]
    cell = lambda r, k: f"{r[k]:.2f}" if r else "-"  # noqa: E731  (a run that did not reach the step)
    for s in (STEPS // 2, STEPS):
        a, b, t = single["en-de"].get(s), single["de-en"].get(s), two.get(2 * s)
        lines.append(f"| same total compute: singles {s} each, two-way {2 * s} | {cell(a, 'eval_bleu')} "
                     f"| {cell(t, 'eval_bleu_en-de')} | {cell(b, 'eval_bleu')} | {cell(t, 'eval_bleu_de-en')} |")
    for s in (STEPS // 2, STEPS):
        a, b, t = single["en-de"].get(s), single["de-en"].get(s), two.get(s)
        lines.append(f"| same steps (two-way: half the compute): {s} | {cell(a, 'eval_bleu')} "
                     f"| {cell(t, 'eval_bleu_en-de')} | {cell(b, 'eval_bleu')} | {cell(t, 'eval_bleu_de-en')} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["train"] and len(sys.argv) == 3 and sys.argv[2] in RUNS:
        print(json.dumps(train(sys.argv[2])))
    elif sys.argv[1:] == ["table"]:
        print(table())
    else:
        sys.exit(f"usage: {sys.argv[0]} train {{{','.join(RUNS)}}} | table")
