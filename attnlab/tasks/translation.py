"""Machine translation with an encoder-decoder (Vaswani et al. 2017): parallel text files, a joint BPE
vocabulary learned on the training data, training from scratch, beam-search translation, sacreBLEU.

    summary = finetune_translation("train.en", "train.de", "val.en", "val.de", "out/en-de", max_minutes=60)
    translate_file("out/en-de", "val.en", "hyp.de", num_beams=4)
    evaluate_translation("out/en-de", "val.en", "val.de")     # {"bleu": 34.1, "signature": ...}

Multilingual (M2M-100 style, Fan et al. 2020, §2; Johnson et al. 2017): `directions=["en-de", "de-en"]`
trains ONE model on both directions of the parallel files. Each language has a token (`__en__`) in the
joint vocabulary; the source starts with its own language token, the target with the target language's,
so the decoder reads `<s> __de__ ...` and generation forces `__de__` as the first token: that token alone
tells the one decoder which language to write (`translate(..., tgt_lang="de")`).

Parallel files hold one sentence per line, line i of the source translating line i of the target.
Training runs on the shared `attnlab.training.Trainer` (its non-finite-loss stop, progress bar, time
budget, keep-best and metrics.jsonl): Adam(0.9, 0.98, 1e-9) with lr = factor * d^-0.5 * min(step^-0.5,
step * warmup^-1.5) (§5.3, the `inverse_sqrt` schedule), label smoothing 0.1 (§5.4), batches of about
`max_tokens` tokens of similar length reshuffled every epoch (§5.1), the best validation BLEU kept.
"""
from __future__ import annotations

import json
import math
import random
import re
import time
import warnings
from pathlib import Path
from typing import Sequence

import torch

from .common import DataError

PAD, EOS, BOS, UNK = "<pad>", "</s>", "<s>", "<unk>"  # ids 0, 1, 2, 3 in the learned vocabulary


# ----------------------------------------------------------------------------------- data
def read_lines(path: str | Path) -> list[str]:
    try:
        with open(path, encoding="utf-8") as fh:
            return [line.rstrip("\r\n") for line in fh]
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: not found") from None
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text ({err})") from None


def read_parallel(src: str | Path, tgt: str | Path) -> list[tuple[str, str]]:
    """Aligned (source, target) pairs. Different line counts are an error naming both files; pairs with
    an empty side are dropped with a warning that counts them and names the first line numbers."""
    s, t = read_lines(src), read_lines(tgt)
    if len(s) != len(t):
        raise DataError(f"parallel files differ in length: {src} has {len(s)} lines but {tgt} has {len(t)} "
                        "(line i of the source must translate line i of the target)")
    empty = [i + 1 for i, (a, b) in enumerate(zip(s, t)) if not a.strip() or not b.strip()]
    if empty:
        warnings.warn(f"{src} / {tgt}: skipped {len(empty)} pair(s) with an empty line (line "
                      f"{', '.join(map(str, empty[:5]))}{', ...' if len(empty) > 5 else ''})", stacklevel=2)
    pairs = [(a.strip(), b.strip()) for a, b in zip(s, t) if a.strip() and b.strip()]
    if not pairs:
        raise DataError(f"{src} / {tgt}: no sentence pairs")
    return pairs


# ----------------------------------------------------------------------------------- vocabulary
class LanguageError(DataError):
    """A direction or language the model or the data does not have: a usage error (the CLI exits with 2)."""
    exit_status = 2


def lang_token(code: str) -> str:
    """M2M-100's spelling of a language token: `__de__`."""
    return f"__{code}__"


def parse_directions(directions: str | Sequence[str], src_lang: str, tgt_lang: str) -> list[tuple[str, str]]:
    """"en-de,de-en" -> [("en", "de"), ("de", "en")]: each a direction between the two languages of the
    parallel files (src_lang, tgt_lang). Anything else is an error naming the bad item."""
    items = [d.strip() for d in (directions.split(",") if isinstance(directions, str) else directions)]
    langs = (src_lang, tgt_lang)
    if src_lang == tgt_lang or not all(re.fullmatch(r"[A-Za-z][\w]*", c or "") for c in langs):
        raise LanguageError(f"--directions needs two different language codes as --src-lang and --tgt-lang "
                            f"(got {src_lang!r} and {tgt_lang!r})")
    out: list[tuple[str, str]] = []
    for item in items:
        a, sep, b = item.partition("-")
        if not sep or a not in langs or b not in langs or a == b:
            raise LanguageError(f"--directions {item!r}: expected SRC-TGT with two different languages of the "
                                f"parallel files ({src_lang}-{tgt_lang} or {tgt_lang}-{src_lang})")
        if (a, b) in out:
            raise LanguageError(f"--directions {item!r}: listed twice")
        out.append((a, b))
    if not out:
        raise LanguageError("--directions: empty (e.g. en-de,de-en)")
    return out


def train_joint_bpe(files: Sequence[str | Path], vocab_size: int = 8000, min_frequency: int = 2,
                    extra_specials: Sequence[str] = ()):
    """One BPE vocabulary for source and target (§5.1: "a shared source-target vocabulary"), so that the
    encoder and decoder embeddings and the output projection can be one matrix. SentencePiece-style
    pre-tokenization (a space becomes "▁" on the next word) makes decoding the exact inverse: the
    output is detokenized text, which is what sacreBLEU scores."""
    import tokenizers as tk
    from ..tokenizers import Tokenizer
    backend = tk.Tokenizer(tk.models.BPE(unk_token=UNK))
    backend.normalizer = tk.normalizers.NFKC()
    backend.pre_tokenizer = tk.pre_tokenizers.Metaspace()
    backend.decoder = tk.decoders.Metaspace()
    trainer = tk.trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                     special_tokens=[PAD, EOS, BOS, UNK, *extra_specials], show_progress=False)
    backend.train([str(f) for f in files], trainer)
    backend.post_processor = tk.processors.TemplateProcessing(single=f"$A {EOS}", special_tokens=[(EOS, 1)])
    return Tokenizer(backend, specials={"pad_token": PAD, "eos_token": EOS, "bos_token": BOS, "unk_token": UNK},
                     model_max_length=1024, name="joint-bpe")


def encode(tokenizer, sentences: Sequence[str], max_length: int, what: str = "sentences") -> list[list[int]]:
    """Ids ending in </s>; longer ones are cut to max_length (keeping </s>) with one warning that counts them."""
    rows = [e.ids for e in tokenizer.backend.encode_batch(list(sentences))]
    long = sum(len(r) > max_length for r in rows)
    if long:
        warnings.warn(f"{long} of {len(rows)} {what} exceed max_length={max_length} tokens and were truncated",
                      stacklevel=2)
        rows = [r if len(r) <= max_length else r[:max_length - 1] + [r[-1]] for r in rows]
    return rows


def token_batches(lengths: Sequence[int], max_tokens: int, shuffle: bool, rng: random.Random | None = None,
                  max_sentences: int = 512) -> list[list[int]]:
    """Indices grouped by similar length, each batch about max_tokens (padded) tokens."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches, cur, width = [], [], 0
    for i in order:
        w = max(width, lengths[i])
        if cur and (w * (len(cur) + 1) > max_tokens or len(cur) >= max_sentences):
            batches.append(cur)
            cur, w = [], lengths[i]
        cur.append(i)
        width = w
    if cur:
        batches.append(cur)
    if shuffle:
        (rng or random.Random(0)).shuffle(batches)
    return batches


def pad(rows: Sequence[Sequence[int]], value: int) -> torch.Tensor:
    out = torch.full((len(rows), max(len(r) for r in rows)), value, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.tensor(r, dtype=torch.long)
    return out


# ----------------------------------------------------------------------------------- translate + score
def language_ids(model, tokenizer, src_lang: str | None, tgt_lang: str | None) -> tuple[str | None, int | None, int | None]:
    """(source language, its prefix id, forced first target id) of a multilingual model
    (config.extra["languages"]), or (src_lang, None, None) for a one-direction model. The target language is
    required and must be one of the model's; the source language defaults to the other one of a
    two-language model."""
    langs = list(model.config.extra.get("languages") or [])
    if not langs:
        if tgt_lang and model.config.extra.get("tgt_lang") not in (None, "tgt", tgt_lang):
            raise LanguageError(f"target language {tgt_lang!r}: this model translates only into "
                                f"{model.config.extra['tgt_lang']!r}")
        return src_lang, None, None
    if not tgt_lang:
        raise LanguageError(f"this model translates into several languages ({', '.join(langs)}): name the target "
                            "language (--target-lang)")
    if src_lang is None and len(langs) == 2 and tgt_lang in langs:
        src_lang = langs[1 - langs.index(tgt_lang)]
    for what, code in (("target", tgt_lang), ("source", src_lang)):
        if code not in langs:
            raise LanguageError(f"{what} language {code!r} is not one of the model's languages ({', '.join(langs)})")
    ids = [tokenizer.backend.token_to_id(lang_token(c)) for c in (src_lang, tgt_lang)]
    if None in ids:
        raise LanguageError(f"the tokenizer has no {lang_token(src_lang if ids[0] is None else tgt_lang)} token")
    return src_lang, ids[0], ids[1]


def translate(model, tokenizer, sentences: Sequence[str], *, num_beams: int = 1, max_tokens: int = 6000,
              max_length: int = 256, length_penalty: float = 1.0, src_lang: str | None = None,
              tgt_lang: str | None = None) -> list[str]:
    """Translations in input order. Empty inputs give empty outputs (the line stays aligned). A
    multilingual model needs `tgt_lang` (its language token is forced as the first output token)."""
    from ..inference.seq2seq import generate
    _, src_id, tgt_id = language_ids(model, tokenizer, src_lang, tgt_lang)
    idx = [i for i, s in enumerate(sentences) if s.strip()]
    if len(idx) < len(sentences):
        warnings.warn(f"{len(sentences) - len(idx)} empty input line(s) translated as empty lines", stacklevel=2)
    out = [""] * len(sentences)
    if not idx:
        return out
    rows = encode(tokenizer, [sentences[i] for i in idx], max_length - (src_id is not None), "input sentences")
    if src_id is not None:
        rows = [[src_id] + r for r in rows]
    was_training = model.training
    model.eval()
    device = next(iter(model.parameters()), torch.empty(0)).device
    # beams multiply the rows each batch decodes; keep the work per batch about the same
    for batch in token_batches([len(r) for r in rows], max(max_tokens // num_beams, max_length), shuffle=False):
        ids = pad([rows[j] for j in batch], model.config.pad_token_id or 0).to(device)
        mask = (ids != (model.config.pad_token_id or 0)).long()
        positions = model.decoder.config.max_position_embeddings - model.config.extra.get("position_offset", 0)
        new = min(int(ids.size(1) * 1.5) + 10, positions - 1)  # BART's tables hold 2 rows before position 0
        gen = generate(model, ids, mask, max_new_tokens=new, num_beams=num_beams, length_penalty=length_penalty,
                       forced_bos_token_id=tgt_id)
        for j, text in zip(batch, tokenizer.batch_decode(gen[:, 1:].tolist())):
            out[idx[j]] = text.strip()
    model.train(was_training)
    return out


def bleu(hypotheses: Sequence[str], references: Sequence[str]) -> dict:
    """sacreBLEU corpus BLEU on detokenized text (its default 13a tokenization), with its signature."""
    import sacrebleu
    if len(hypotheses) != len(references):
        raise DataError(f"{len(hypotheses)} translations for {len(references)} references")
    metric = sacrebleu.metrics.BLEU()
    score = metric.corpus_score(list(hypotheses), [list(references)])
    return {"bleu": round(score.score, 2), "bp": round(score.bp, 4),
            "ratio": round(score.sys_len / max(score.ref_len, 1), 4),
            "precisions": [round(p, 2) for p in score.precisions], "sys_len": score.sys_len,
            "ref_len": score.ref_len, "signature": str(metric.get_signature())}


def load_translator(model_dir: str | Path):
    from ..interop import load
    from ..tokenizers import load_tokenizer
    model_dir = Path(model_dir)
    return load(model_dir), load_tokenizer(model_dir)


def translate_file(model_dir: str | Path, source: str | Path, output: str | Path, *, num_beams: int = 4,
                   max_length: int = 256, src_lang: str | None = None, tgt_lang: str | None = None) -> int:
    model, tok = load_translator(model_dir)
    language_ids(model, tok, src_lang, tgt_lang)  # a wrong language fails before the file is read
    lines = read_lines(source)
    hyps = translate(model, tok, lines, num_beams=num_beams, max_length=max_length, src_lang=src_lang,
                     tgt_lang=tgt_lang)
    from ..interop.files import atomic_write
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(output, lambda tmp: Path(tmp).write_text("".join(h + "\n" for h in hyps), encoding="utf-8"))
    return len(hyps)


def evaluate_translation(model_dir: str | Path, source: str | Path, reference: str | Path, *, num_beams: int = 4,
                         max_length: int = 256, src_lang: str | None = None, tgt_lang: str | None = None) -> dict:
    pairs = read_parallel(source, reference)  # same checks as training data: counts, empty lines
    model, tok = load_translator(model_dir)
    src_lang = language_ids(model, tok, src_lang, tgt_lang)[0]
    start = time.time()
    hyps = translate(model, tok, [p[0] for p in pairs], num_beams=num_beams, max_length=max_length,
                     src_lang=src_lang, tgt_lang=tgt_lang)
    direction = {"direction": f"{src_lang}-{tgt_lang}"} if tgt_lang and src_lang else {}
    return {**bleu(hyps, [p[1] for p in pairs]), **direction, "sentences": len(pairs), "num_beams": num_beams,
            "seconds": round(time.time() - start, 1)}


# ----------------------------------------------------------------------------------- training
def inverse_sqrt_lr(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """§5.3: lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5): linear warmup, then 1/sqrt(step)."""
    step = max(step, 1)
    return factor * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def finetune_translation(train_src: str | Path, train_tgt: str | Path, valid_src: str | Path | None,
                         valid_tgt: str | Path | None, output: str | Path, *, src_lang: str = "src",
                         tgt_lang: str = "tgt", model: str = "transformer-base", overrides: dict | None = None,
                         vocab_size: int = 8000, max_tokens: int = 4096, max_length: int = 128,
                         epochs: float = 30.0, max_steps: int | None = None, max_minutes: float | None = None,
                         warmup: int | None = None, lr_factor: float = 1.0, eval_every: int | None = None,
                         eval_beams: int = 1, max_eval_sentences: int | None = None, seed: int = 42,
                         log_every: int = 50, threads: int | None = None, progress: bool = True,
                         save_every: int = 0, resume: bool = False,
                         directions: str | Sequence[str] | None = None) -> dict:
    """Train an encoder-decoder from scratch (`model` = a preset name, resized by `overrides`) or
    further (`model` = a directory with a tokenizer) on a parallel corpus. The checkpoint with the best
    validation BLEU is written to `output` with its tokenizer and its scores (best.json); metrics.jsonl logs
    the run, metrics.json (returned) sums it up. With `resume` and a checkpoint in OUTPUT/checkpoints, the
    tokenizer saved in OUTPUT is reused (the checkpoints were trained with it). `directions` ("en-de,de-en",
    between src_lang and tgt_lang) trains one multilingual model with language tokens (module docstring);
    its validation BLEU is the mean over the directions, each also logged as bleu_SRC-TGT."""
    from ..config import PRESETS, preset
    from ..interop.files import atomic_write
    from ..interop.native import save_model  # the HF layout where the family has one (an RNN has not)
    from ..models.rnn import RNNSeq2Seq
    from ..models.seq2seq import Seq2SeqLM
    from ..training import TrainArgs, Trainer
    from ..tokenizers import load_tokenizer
    from ..training.checkpoint import keep_best, list_checkpoints
    from .common import EpochBatches
    if threads:
        torch.set_num_threads(threads)
    random.seed(seed)
    torch.manual_seed(seed)
    ways = parse_directions(directions, src_lang, tgt_lang) if directions else None
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    pairs = read_parallel(train_src, train_tgt)
    valid = read_parallel(valid_src, valid_tgt) if valid_src and valid_tgt else None
    if valid is not None and max_eval_sentences:
        valid = valid[:max_eval_sentences]

    resuming = resume and bool(list_checkpoints(output))
    if model in PRESETS:
        # a resumed run keeps the vocabulary its checkpoints (and the best model kept in OUTPUT) were trained
        # with: retraining it from other options would overwrite the kept model's tokenizer
        tok = load_tokenizer(output) if resuming else train_joint_bpe(
            [train_src, train_tgt], vocab_size, extra_specials=[lang_token(c) for c in (src_lang, tgt_lang)] if ways else ())
        fields = {k: v for k, v in (overrides or {}).items() if not k.startswith("extra.")}
        cfg = preset(model, **fields)
        extra = {**cfg.extra, "src_lang": src_lang, "tgt_lang": tgt_lang}
        if ways:
            extra.update(languages=[src_lang, tgt_lang], directions=[f"{a}-{b}" for a, b in ways])
        if "num_layers" in fields:  # a resized stack: the decoder follows unless told otherwise
            extra["num_decoder_layers"] = fields["num_layers"]
        extra.update({k[len("extra."):]: v for k, v in (overrides or {}).items() if k.startswith("extra.")})
        cfg = cfg.replace(vocab_size=tok.vocab_size, pad_token_id=0, eos_token_id=1, bos_token_id=2,
                          extra={**extra, "decoder_start_token_id": 2 if cfg.model_type != "t5" else 0})
        net = (RNNSeq2Seq if cfg.model_type == "rnn" else Seq2SeqLM)(cfg)
    else:
        net, tok = load_translator(model)
        cfg = net.config
    if (ways or cfg.extra.get("languages")) and sorted(cfg.extra.get("languages") or []) != sorted((src_lang, tgt_lang)):
        raise DataError(f"{model}: trained for languages {cfg.extra.get('languages') or 'none (one direction)'}, "
                        f"not --directions between {src_lang} and {tgt_lang}")
    if cfg.extra.get("languages") and not ways:
        raise DataError(f"{model}: a multilingual model; name the --directions to train (e.g. "
                        f"{src_lang}-{tgt_lang},{tgt_lang}-{src_lang})")
    if ways:  # each direction's pairs, with its language tokens in front of both sides
        src_rows, tgt_rows = [], []
        side = {src_lang: (0, train_src), tgt_lang: (1, train_tgt)}
        cut = {c: encode(tok, [p[i] for p in pairs], max_length - 1, f"{f} sentences") for c, (i, f) in side.items()}
        for a, b in ways:
            ida, idb = (tok.backend.token_to_id(lang_token(c)) for c in (a, b))
            src_rows += [[ida] + r for r in cut[a]]
            tgt_rows += [[idb] + r for r in cut[b]]
    else:
        src_rows = encode(tok, [p[0] for p in pairs], max_length, f"{train_src} sentences")
        tgt_rows = encode(tok, [p[1] for p in pairs], max_length, f"{train_tgt} sentences")
    lengths = [max(len(a), len(b)) for a, b in zip(src_rows, tgt_rows)]

    def make(idx: list[int]) -> dict:
        ids = pad([src_rows[i] for i in idx], 0)
        return {"input_ids": ids, "attention_mask": (ids != 0).long(), "labels": pad([tgt_rows[i] for i in idx], -100)}

    data = EpochBatches(lambda epoch: token_batches(lengths, max_tokens, shuffle=True, rng=random.Random(seed + epoch)),
                        make)
    steps_per_epoch = len(data)
    total = max_steps or int(math.ceil(epochs * steps_per_epoch))
    warmup = warmup or int(cfg.extra.get("warmup_steps", 4000))
    beta1, beta2 = (float(b) for b in cfg.extra.get("adam_betas", (0.9, 0.98)))
    if not resuming:
        tok.save(output)
    if not resume:
        (output / "metrics.jsonl").write_text("")  # this run's log (the Trainer appends)
    args = TrainArgs(output_dir=str(output), max_steps=total, max_minutes=max_minutes or 0.0,
                     lr=inverse_sqrt_lr(warmup, cfg.hidden_size, warmup, lr_factor),  # the peak, at step = warmup
                     schedule="inverse_sqrt", warmup_steps=warmup, weight_decay=0.0,  # AdamW without decay = Adam
                     beta1=beta1, beta2=beta2, eps=float(cfg.extra.get("adam_eps", 1e-9)), clip_norm=1.0,
                     eval_every=(eval_every or steps_per_epoch) if valid is not None else 0, log_every=log_every,
                     save_every=save_every, keep_last=2 if save_every else 0, resume=resume,  # see finetune()
                     seed=seed, progress=progress, best_metric="bleu" if valid is not None else "")
    scores: dict = {}   # the full sacreBLEU result of the latest validation (the Trainer keeps numbers only)
    best: dict = {}
    start = time.time()

    def evaluate(model) -> dict:
        scores.clear()
        scores.update(_validate(model, tok, valid, eval_beams, max_length, ways, (src_lang, tgt_lang)))
        return {k: v for k, v in scores.items() if isinstance(v, (int, float))}

    def on_best(model, record: dict) -> None:  # best.json: the kept model's scores, for a resumed run's summary
        best.clear()
        best.update(scores, step=record["step"], elapsed_s=round(time.time() - start, 1))
        keep_best(lambda: (save_model(model, output), atomic_write(output / "best.json", lambda tmp: Path(tmp).write_text(
            json.dumps(best, indent=2) + "\n"))), output, record["step"])

    trainer = Trainer(net, args, data, evaluate_fn=evaluate if valid is not None else None, on_best=on_best,
                      count_tokens=lambda b: int(b["attention_mask"].sum()) + int((b["labels"] != -100).sum()))
    trainer.train()
    if valid is not None and not best and trainer.best:  # resumed after its best step: that step's full scores
        kept = json.loads((output / "best.json").read_text()) if (output / "best.json").is_file() else {}
        best.update(kept if kept.get("step") == trainer.best["step"] else
                    {k[len("eval_"):] if k.startswith("eval_") else k: v for k, v in trainer.best.items()})
    if valid is None:
        save_model(net, output)
    summary = {"task": "translation", "src_lang": src_lang, "tgt_lang": tgt_lang,
               **({"directions": [f"{a}-{b}" for a, b in ways]} if ways else {}), "steps": trainer.step,
               "epochs": round(trainer.step / steps_per_epoch, 2), "train_pairs": len(pairs),
               "train_examples": len(src_rows),
               "minutes": round((time.time() - start) / 60, 1),
               "parameters": net.num_parameters(), "vocab_size": tok.vocab_size, "max_length": max_length,
               "best": dict(best) if valid is not None else None, "config": {k: v for k, v in cfg.to_dict().items()
                                                                      if k in ("hidden_size", "num_layers", "num_heads",
                                                                               "intermediate_size", "dropout")}}
    atomic_write(output / "metrics.json", lambda tmp: Path(tmp).write_text(json.dumps(summary, indent=2) + "\n"))
    return summary


def _validate(model, tok, valid: list[tuple[str, str]], num_beams: int, max_length: int,
              ways: list[tuple[str, str]] | None = None, langs: tuple[str, str] = ("src", "tgt")) -> dict:
    """BLEU of the decoded validation sources: what the kept checkpoint is chosen by. A multilingual model:
    each direction's BLEU (bleu_en-de, ...) and their mean as "bleu"."""
    if not ways:
        hyps = translate(model, tok, [p[0] for p in valid], num_beams=num_beams, max_length=max_length)
        model.train()
        return bleu(hyps, [p[1] for p in valid])
    out: dict = {}
    for a, b in ways:
        ia, ib = langs.index(a), langs.index(b)
        hyps = translate(model, tok, [p[ia] for p in valid], num_beams=num_beams, max_length=max_length,
                         src_lang=a, tgt_lang=b)
        out[f"{a}-{b}"] = bleu(hyps, [p[ib] for p in valid])
        out[f"bleu_{a}-{b}"] = out[f"{a}-{b}"]["bleu"]
    model.train()
    out["bleu"] = round(sum(out[f"bleu_{a}-{b}"] for a, b in ways) / len(ways), 2)
    return out


__all__ = ["LanguageError", "bleu", "encode", "evaluate_translation", "finetune_translation", "inverse_sqrt_lr", "lang_token",
           "language_ids", "parse_directions", "read_parallel", "token_batches", "train_joint_bpe", "translate",
           "translate_file"]
