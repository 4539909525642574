"""Does TLM align the languages? MLM vs MLM+TLM on Multi30k en-de, scored by cross-lingual retrieval.

Lample & Conneau (2019, §3.3) claim that translation language modelling (a sentence and its translation in
one input, masks on both sides) makes a shared encoder align its languages. This trains the same small
bilingual encoder twice, same seed, same steps, same sentences per step:
  mlm      every step: MLM over single sentences (both sides of B/2 training pairs, each with its language id)
  mlm+tlm  even steps as `mlm`; odd steps: TLM over the same number of pairs, concatenated (objectives/tlm.py)
then embeds the 1,014 validation pairs (mean of the last hidden states over real tokens, language ids given)
and counts how often the nearest sentence by cosine in the other language is the translation (accuracy @1,
en->de and de->en). The step-0 model is scored too: the floor that shared sub-words give before training.

    export OMP_NUM_THREADS=1
    nice -n 10 python research/xlm/retrieval.py --objective mlm --out /work/runs/xlm/main
    nice -n 10 python research/xlm/retrieval.py --objective mlm+tlm --out /work/runs/xlm/main
(defaults: 2000 steps of 32 pairs, 2 layers x 128, 2 heads, 10k WordPiece, eval every 500 steps; RESULTS.md)

Writes OUT/OBJECTIVE/{metrics.jsonl, result.json} (and the tokenizer once in OUT/tokenizer); prints the result.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from attnlab.config import ModelConfig
from attnlab.heads import MaskedLM, mean_pool
from attnlab.objectives.mlm import Vocab, mlm_loss
from attnlab.objectives.tlm import mono_collate, tlm_collate
from attnlab.tokenizers import load_tokenizer, train_tokenizer
from attnlab.training.trainer import Trainer, TrainArgs

EN, DE = 0, 1  # language ids


def read_pairs(root: Path, split: str) -> tuple[list[str], list[str]]:
    en = (root / f"{split}.en").read_text(encoding="utf-8").splitlines()
    de = (root / f"{split}.de").read_text(encoding="utf-8").splitlines()
    if len(en) != len(de):
        sys.exit(f"{root}/{split}.en has {len(en)} lines but {split}.de has {len(de)}")
    return en, de


def tokenizer_for(root: Path, out: Path, vocab_size: int):
    """One WordPiece vocabulary learned from the English and German training text (shared sub-words, as XLM's BPE)."""
    path = out / "tokenizer"
    if not (path / "tokenizer.json").exists():
        tok = train_tokenizer("wordpiece", [root / "train.en", root / "train.de"], vocab_size)
        tok.save(path)
    return load_tokenizer(path)


def encode(tok, texts: list[str], max_len: int) -> list[list[int]]:
    return [ids[:max_len - 1] + ids[-1:] if len(ids) > max_len else ids
            for ids in (tok.encode(t) for t in texts)]  # [CLS] ... [SEP], cut before the final [SEP]


def batches(en_ids, de_ids, objective: str, pairs_per_step: int, vocab: Vocab, seed: int, pad_id: int):
    """Endless batches. Step k draws the same pairs in both runs (rng of the seed); only how they are fed differs."""
    draw = np.random.default_rng(seed)
    mask_rng = np.random.default_rng(seed + 1)
    step = 0
    while True:
        idx = draw.choice(len(en_ids), pairs_per_step, replace=False)
        if objective == "mlm+tlm" and step % 2 == 1:
            yield tlm_collate([(en_ids[i], de_ids[i]) for i in idx], (EN, DE), vocab, mask_rng, pad_id=pad_id)
        else:
            sents = [en_ids[i] for i in idx] + [de_ids[i] for i in idx]
            yield mono_collate(sents, [EN] * len(idx) + [DE] * len(idx), vocab, mask_rng, pad_id=pad_id)
        step += 1


@torch.no_grad()
def embed(model, ids: list[list[int]], lang: int, pad_id: int, batch_size: int = 128) -> torch.Tensor:
    model.eval()
    out = []
    for s in range(0, len(ids), batch_size):
        rows = ids[s:s + batch_size]
        length = max(map(len, rows))
        x = torch.full((len(rows), length), pad_id, dtype=torch.long)
        mask = torch.zeros_like(x)
        for i, r in enumerate(rows):
            x[i, :len(r)], mask[i, :len(r)] = torch.tensor(r), 1
        h = model.backbone(input_ids=x, attention_mask=mask, langs=torch.full_like(x, lang)).last_hidden_state
        out.append(mean_pool(h, mask))
    model.train()
    return torch.cat(out)


def retrieval(model, val_en, val_de, pad_id: int) -> dict[str, float]:
    """Accuracy @1 both ways: row i's nearest neighbour (cosine) in the other language is its translation.
    `centred_*`: the same after subtracting each language's mean vector, which removes the offset a language
    embedding adds to every sentence of that language (the cosine then compares what the sentences say)."""
    e, d = embed(model, val_en, EN, pad_id), embed(model, val_de, DE, pad_id)
    gold = torch.arange(len(e))
    out = {}
    for name, (a, b) in (("", (e, d)), ("centred_", (e - e.mean(0), d - d.mean(0)))):
        sim = F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T
        out[f"{name}en2de_at1"] = float((sim.argmax(1) == gold).float().mean())
        out[f"{name}de2en_at1"] = float((sim.argmax(0) == gold).float().mean())
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--objective", choices=("mlm", "mlm+tlm"), required=True)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--pairs-per-step", type=int, default=32, help="pairs drawn per step (MLM: 2x sentences)")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--vocab-size", type=int, default=10000)
    p.add_argument("--max-len", type=int, default=40, help="tokens per sentence, [CLS] and [SEP] included")
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--eval-every", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", type=Path, default=Path(os.environ.get("ATTNLAB_DATA", "/work/shared/data")) / "multi30k")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    for split in ("train", "val"):
        for lang in ("en", "de"):
            if not (args.data / f"{split}.{lang}").is_file():
                p.error(f"--data {args.data}: no {split}.{lang} (Multi30k task 1, raw)")
    load0 = os.getloadavg()
    wall0, cpu0 = time.time(), time.process_time()
    torch.manual_seed(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    tok = tokenizer_for(args.data, args.out, args.vocab_size)
    train_en, train_de = (encode(tok, t, args.max_len) for t in read_pairs(args.data, "train"))
    val_en, val_de = (encode(tok, t, args.max_len) for t in read_pairs(args.data, "val"))
    pad_id = tok.pad_token_id
    config = ModelConfig(vocab_size=tok.vocab_size, hidden_size=args.hidden, num_layers=args.layers,
                         num_heads=args.heads, intermediate_size=4 * args.hidden, max_position_embeddings=128,
                         type_vocab_size=0, num_languages=2, pooler=False, pad_token_id=pad_id)
    model = MaskedLM(config)
    run = args.out / args.objective.replace("+", "_")
    start = {"step": 0, **retrieval(model, val_en, val_de, pad_id)}
    print(json.dumps(start), flush=True)
    vocab = Vocab.from_tokenizer(tok)
    data = batches(train_en, train_de, args.objective, args.pairs_per_step, vocab, args.seed, pad_id)
    targs = TrainArgs(output_dir=str(run), max_steps=args.steps, lr=args.lr, warmup_steps=args.steps // 20,
                      schedule="linear", eval_every=args.eval_every, keep_last=0, log_every=50, seed=args.seed,
                      progress=False, device="cpu")
    trainer = Trainer(model, targs, data, loss_fn=mlm_loss,
                      evaluate_fn=lambda m: retrieval(m, val_en, val_de, pad_id))
    trainer.train()
    final = retrieval(model, val_en, val_de, pad_id)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result = {"objective": args.objective, "steps": args.steps, "pairs_per_step": args.pairs_per_step,
              "seed": args.seed, "parameters": model.num_parameters(), "step0": start, **final,
              "wall_s": round(time.time() - wall0, 1), "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
              "cpu_s_process_time": round(time.process_time() - cpu0, 1),
              "load_before": [round(x, 2) for x in load0], "load_after": [round(x, 2) for x in os.getloadavg()],
              "threads": torch.get_num_threads(), "command": " ".join(sys.argv)}
    (run / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
