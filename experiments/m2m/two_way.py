"""One two-way model (en->de and de->en, M2M-100-style language tokens) against two one-direction models on
Multi30k, at the same training budget (issue 23, "multilingual translation with a language prefix").

Every run: the original-Transformer preset resized as the README's recipe (d_model 256, 3 + 3 layers,
4 heads, FFN 1024, joint BPE 8k), batches of 2,048 padded tokens, warmup 100, lr factor 0.2 (peak 1.25e-3),
one thread. The singles train STEPS steps each; the two-way model trains 2 x STEPS steps on the mixed
directions: the same total compute as the two singles combined (the fair comparison), and it is also
scored after STEPS steps (the same steps as ONE single, i.e. half the compute). Greedy sacreBLEU on the
1,014 Multi30k validation pairs each way.

    python experiments/m2m/two_way.py train en-de      # one run (run.sh starts the three side by side)
    python experiments/m2m/two_way.py table             # RESULTS table from the runs' metrics
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

STEPS = int(os.environ.get("STEPS", 400))
OUT = Path(os.environ.get("OUT", "/work/runs/m2m"))
DATA = Path(os.environ.get("ATTNLAB_DATA", "/work/shared/data")) / "multi30k"
MODEL = {"hidden_size": 256, "num_layers": 3, "num_heads": 4, "intermediate_size": 1024}
RUNS = {"en-de": ("en", "de", None, STEPS), "de-en": ("de", "en", None, STEPS),
        "two-way": ("en", "de", "en-de,de-en", 2 * STEPS)}


def train(name: str) -> dict:
    from attnlab.tasks.translation import finetune_translation
    src, tgt, directions, steps = RUNS[name]
    return finetune_translation(DATA / f"train.{src}", DATA / f"train.{tgt}", DATA / f"val.{src}", DATA / f"val.{tgt}",
                                OUT / name, src_lang=src, tgt_lang=tgt, model="transformer-base", overrides=MODEL,
                                vocab_size=8000, max_tokens=2048, max_steps=steps, warmup=100, lr_factor=0.2,
                                eval_every=STEPS, eval_beams=1, seed=42, threads=1, progress=False,
                                directions=directions)


def table() -> str:
    def evals(name: str) -> dict[int, dict]:
        rows = [json.loads(line) for line in (OUT / name / "metrics.jsonl").read_text().splitlines() if line.strip()]
        return {r["step"]: r for r in rows if any(k.startswith("eval_") for k in r)}
    single = {n: evals(n)[STEPS] for n in ("en-de", "de-en")}
    two = evals("two-way")
    lines = ["| model | steps (batches of 2,048 tokens) | en->de BLEU | de->en BLEU |", "|---|---|---|---|",
             f"| two one-direction models | {STEPS} each ({2 * STEPS} in all) | {single['en-de']['eval_bleu']:.2f} "
             f"| {single['de-en']['eval_bleu']:.2f} |"]
    for steps, what in ((STEPS, "same steps as one single (half the compute)"),
                        (2 * STEPS, "same total compute as the two singles")):
        if steps in two:
            r = two[steps]
            lines.append(f"| one two-way model, {what} | {steps} | {r['eval_bleu_en-de']:.2f} | {r['eval_bleu_de-en']:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["train"] and len(sys.argv) == 3 and sys.argv[2] in RUNS:
        print(json.dumps(train(sys.argv[2])))
    elif sys.argv[1:] == ["table"]:
        print(table())
    else:
        sys.exit(f"usage: {sys.argv[0]} train {{{','.join(RUNS)}}} | table")
