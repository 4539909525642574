"""10. Heads specialise (Clark et al. 2019, "What Does BERT Look At?"): individual heads attend in broad,
nameable patterns — to [SEP] or [CLS], to the previous or next token, to the other pieces of the same
word — and what the layers encode changes with depth (Tenney et al. 2019): a linear probe per layer for
CoNLL-2003 entity tags shows where that information is easiest to read.

Measured on MiniLM (all-MiniLM-L6-v2) over CoNLL-2003 sentences: for every layer and head, the mean share
of each token's attention that goes to each pattern; and per layer (0 = the embedding layer), a softmax
regression on the first word piece of each word, trained on some sentences and scored on others."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..interop.api import load, load_tokenizer
from ..tasks.ner import entity_scores, read_conll
from .report import Report, heatmaps, line_plot

NAME = "heads"
CLAIM = ("Attention heads specialise: some attend to [SEP]/[CLS], some to the previous or next token, some to "
         "the other pieces of a word; and different layers hold different information.")
PATTERNS = ("[CLS]", "[SEP]", "previous token", "next token", "same word")


def pattern_masks(word_ids: list[int | None]) -> dict[str, np.ndarray]:
    """For one tokenized sentence ([CLS] ... [SEP]): query x key masks of each pattern."""
    n = len(word_ids)
    masks = {p: np.zeros((n, n), dtype=bool) for p in PATTERNS}
    masks["[CLS]"][:, 0] = True
    masks["[SEP]"][:, n - 1] = True
    for i in range(1, n - 1):  # queries: the sentence's own tokens
        masks["previous token"][i, i - 1] = True
        masks["next token"][i, i + 1] = True
        for j in range(1, n - 1):
            if j != i and word_ids[j] == word_ids[i]:
                masks["same word"][i, j] = True
    return masks


def head_shares(model, tokenizer, sentences: list[list[str]]) -> dict[str, np.ndarray]:
    """pattern -> (layers, heads) mean attention share, over the sentences' real tokens (not [CLS]/[SEP];
    'same word' averages over tokens of multi-piece words only)."""
    sums, counts = {}, {}
    for words in sentences:
        enc = tokenizer(words, is_split_into_words=True, truncation=True, max_length=128)
        ids, word_ids = enc["input_ids"], enc.word_ids(0)
        ids = ids[0] if isinstance(ids[0], list) else ids
        with torch.no_grad():
            att = model(input_ids=torch.tensor([ids]), output_attentions=True).attentions
        att = torch.stack([a[0] for a in att]).numpy()          # (layers, heads, n, n)
        for p, m in pattern_masks(word_ids).items():
            rows = m.any(1)
            if not rows.any():
                continue
            share = (att * m).sum(-1)[..., rows]                # (layers, heads, rows)
            sums[p] = sums.get(p, 0) + share.sum(-1)
            counts[p] = counts.get(p, 0) + rows.sum()
    return {p: sums[p] / counts[p] for p in sums}


def layer_features(model, tokenizer, sentences: list[dict]) -> tuple[list[np.ndarray], list[str]]:
    """Per layer: the first word piece's hidden state of every word, stacked; and the words' tags."""
    per_layer: list[list[np.ndarray]] = []
    tags: list[str] = []
    for s in sentences:
        enc = tokenizer(s["words"], is_split_into_words=True, truncation=True, max_length=128)
        ids, word_ids = enc["input_ids"], enc.word_ids(0)
        ids = ids[0] if isinstance(ids[0], list) else ids
        first: dict[int, int] = {}
        for i, w in enumerate(word_ids):
            if w is not None and w not in first:
                first[w] = i
        with torch.no_grad():
            hidden = model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
        words = sorted(first)
        if not per_layer:
            per_layer = [[] for _ in hidden]
        for rows, h in zip(per_layer, hidden):
            rows.append(h[0, [first[w] for w in words]].numpy())
        tags += [s["tags"][w] for w in words]
    return [np.concatenate(rows) for rows in per_layer], tags


def probe(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, classes: int, steps: int = 300,
          seed: int = 0) -> np.ndarray:
    """Softmax regression (standardised features, a little weight decay, full-batch Adam); test predictions."""
    torch.manual_seed(seed)
    mean, std = train_x.mean(0), train_x.std(0) + 1e-6
    x, xt = torch.tensor((train_x - mean) / std), torch.tensor((test_x - mean) / std)
    y = torch.tensor(train_y)
    linear = torch.nn.Linear(x.shape[1], classes)
    opt = torch.optim.Adam(linear.parameters(), lr=0.05, weight_decay=1e-4)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(linear(x), y).backward()
        opt.step()
    with torch.no_grad():
        return linear(xt).argmax(-1).numpy()


def run(out: Path, *, tiny: bool = False, data: Path | None = None) -> Report:
    if data is None:
        raise ValueError("heads needs the data directory (ATTNLAB_DATA or --data)")
    sentences = [s for s in read_conll(data / "conll2003" / "train.txt") if 4 <= len(s["words"]) <= 60]
    rng = np.random.default_rng(0)
    chosen = [sentences[i] for i in rng.permutation(len(sentences))[:60 if tiny else 1500]]
    n_attn, n_train = (20, 40) if tiny else (300, 1000)
    model, tokenizer = load("minilm").eval(), load_tokenizer("minilm")
    shares = head_shares(model, tokenizer, [s["words"] for s in chosen[:n_attn]])
    layers, heads = next(iter(shares.values())).shape
    rows = []
    for p in PATTERNS:
        grid = shares[p]
        layer, head = np.unravel_index(grid.argmax(), grid.shape)
        rows.append([p, f"{grid.mean():.3f}", f"L{layer + 1}.H{head + 1}", f"{grid.max():.3f}",
                     int((grid > 0.5).sum())])
    train_feats, train_tags = layer_features(model, tokenizer, chosen[:n_train])
    test_feats, test_tags = layer_features(model, tokenizer, chosen[n_train:])
    labels = sorted(set(train_tags) | set(test_tags))
    index = {t: i for i, t in enumerate(labels)}
    ytr = np.array([index[t] for t in train_tags])
    f1s, accs = [], []
    for trx, tex in zip(train_feats, test_feats):
        pred = probe(trx, ytr, tex, len(labels), steps=60 if tiny else 300)
        predicted = [labels[i] for i in pred]
        accs.append(float(np.mean([a == b for a, b in zip(predicted, test_tags)])))
        f1s.append(entity_scores([test_tags], [predicted])["f1"])
    probe_rows = [[f"{i}" + (" (embeddings)" if i == 0 else ""), round(a, 3), round(f, 1)]
                  for i, (a, f) in enumerate(zip(accs, f1s))]
    png = out / f"{NAME}.png"
    heatmaps(png, {p: shares[p] for p in PATTERNS}, xlabel="head", ylabel="layer")
    line_plot(out / f"{NAME}-probe.png", list(range(len(f1s))), {"entity F1 (%)": f1s,
                                                                  "token accuracy (%)": [100 * a for a in accs]},
              xlabel="layer (0 = embeddings)", ylabel="score", title="linear probe for CoNLL-2003 tags, per layer")
    best = int(np.argmax(f1s))
    specialised = [r for r in rows if float(r[3]) > 3 * float(r[1]) and float(r[3]) > 0.3]
    holds = len(specialised) >= 3 and best > 0
    verdict = (f"{len(specialised)} of {len(PATTERNS)} patterns have a head that gives it over 3x the average "
               f"head's share and over 30% of its attention ("
               + "; ".join(f"{r[0]}: {r[2]} {float(r[3]):.0%} vs mean {float(r[1]):.0%}" for r in rows)
               + f"). The entity probe peaks at layer {best} (F1 {f1s[best]:.1f}) vs {f1s[0]:.1f} on the "
               f"embedding layer and {f1s[-1]:.1f} on the last.")
    return Report(NAME, CLAIM, ["pattern", "mean share over heads", "most specialised head", "its share",
                                "heads above 50%"], rows, verdict, holds,
                  tables=[("Linear probe for CoNLL-2003 tags on each layer's first word pieces (held-out sentences):",
                           ["layer", "token accuracy", "entity F1"], probe_rows)],
                  settings={"attention_sentences": n_attn, "probe_train_sentences": n_train,
                            "probe_test_sentences": len(chosen) - n_train, "layers": layers, "heads": heads,
                            "tiny": tiny},
                  notes=[f"Probe plot: {NAME}-probe.png."], figure=png)
