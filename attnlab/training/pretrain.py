"""`attnlab pretrain`: a YAML recipe -> dataclasses -> model + data + objective -> Trainer.

A recipe has four sections; every key maps onto a dataclass field and an unknown key is an error
that names it (`configs/pretrain-bert-mini.yaml` is a complete example):

    model:      preset: bert-mini        # any attnlab.config preset, then ModelConfig fields
                max_position_embeddings: 128
                # or: init_from: DIR         # continue from a checkpoint (its architecture, its weights)
                embedding_init: ppmi         # word embeddings from corpus counts first (attnlab.data.cooccur)
    data:       path: runs/corpus        # a prepared corpus (attnlab prepare); built first if absent
                files: [...]             #   from these files (globs; $ATTNLAB_DATA is expanded)
                tokenizer: DIR | char    #   with this tokenizer (a directory, or "char" to build one,
                                         #   or "bart-bpe:N" to learn a BART byte-level BPE of N tokens)
                seq_len: 128
                batch_size: 32
    objective:  kind: mlm+nsp            # see attnlab.objectives.ObjectiveConfig
    train:      max_steps: 1000          # see attnlab.training.TrainArgs
                output_dir: runs/bert-mini

`model.init_from=DIR` continues masked-LM pretraining from any encoder checkpoint `attnlab.load` reads
(attnlab's own layout or Hugging Face's: BertModel, BertForMaskedLM, BertForPreTraining, a fine-tuned
classifier...): the architecture is the checkpoint's, its backbone and heads are loaded, and a head the
checkpoint lacks (the MLM head of a bare encoder, NSP) starts fresh; a sentence-transformers source
(all-MiniLM-L6-v2) passes its pooling files on to OUTPUT/model, so `finetune` reads the result with the same
(mean) pooling. Domain- and task-adaptive pretraining (SciBERT, Gururangan et al. 2020) are this with a new
corpus in the same vocabulary.

Every MLM evaluation also logs `unigram_accuracy` / `unigram_loss` on the same held-out masked tokens
(objectives.mlm.unigram_baseline over the training shards' counts); OUTPUT/summary.json gives tokens/s
and MFU (model FLOPs over the matmul ceiling in the run's precision, best of start and end).

Overrides on the command line use dotted keys: `train.lr=3e-4 data.batch_size=16` (values are YAML).
"""
from __future__ import annotations

import dataclasses
import glob
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..config import PRESETS, ConfigError, ModelConfig, preset, type_mismatch
from ..data.root import expand_data_root
from ..objectives import ObjectiveConfig, build_objective
from .args import TrainArgs
from .trainer import Trainer, distributed_context


@dataclass
class DataConfig:
    path: str = ""
    files: list[str] = field(default_factory=list)
    tokenizer: str = ""
    documents: str = "auto"          # see attnlab.data.corpus
    raw: bool = False                # keep the text verbatim (character-level models)
    heldout: float = 0.01
    heldout_mode: str = "documents"
    shard_tokens: int = 1_000_000
    seq_len: int = 128
    batch_size: int = 32             # micro-batch per process
    eval_batches: int = 50
    slices: int | None = None        # data slices; default: one per process


@dataclass
class PretrainConfig:
    model: dict[str, Any] = field(default_factory=dict)
    data: DataConfig = field(default_factory=DataConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    train: TrainArgs = field(default_factory=TrainArgs)


def _typed(cls, values: dict, where: str):
    if not isinstance(values, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(values).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = [k for k in values if k not in fields]
    if unknown:
        raise ConfigError(f"{where}: unknown key {where.split(':')[-1].strip() + '.' if ':' in where else ''}"
                          f"{unknown[0]!r}; known keys: {', '.join(fields)}")
    out = cls(**values)
    for name, f in fields.items():  # YAML reads 3e-4 as a string and 5 as an int: coerce to the field type
        v = getattr(out, name)
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
        try:
            if kind == "float" and isinstance(v, (int, str)) and not isinstance(v, bool):
                setattr(out, name, float(v))
            elif kind == "int" and isinstance(v, (str, float)) and float(v).is_integer():
                setattr(out, name, int(float(v)))
        except (ValueError, OverflowError):
            raise ConfigError(f"{where}: {name}={v!r} is not a number") from None
        want = type_mismatch(getattr(out, name), f.type)
        if want:
            raise ConfigError(f"{where}: {name}={getattr(out, name)!r} must be {want}")
    if hasattr(out, "validate"):
        try:
            out.validate()
        except ConfigError:
            raise
        except ValueError as err:  # the dataclass's own checks name the field
            raise ConfigError(f"{where.split(':')[0]}: {err}") from None
    return out


def set_dotted(tree: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for k in keys[:-1]:
        node = node.setdefault(k, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {dotted}: {k} is not a section")
    node[keys[-1]] = value


def load_config(path: str | Path | None, overrides: list[str] = ()) -> PretrainConfig:
    tree: dict = {}
    source = str(path) if path else "config"
    if path:
        try:
            tree = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        except FileNotFoundError:
            raise FileNotFoundError(f"{path}: no such config file") from None
        except (yaml.YAMLError, UnicodeDecodeError) as err:
            raise ConfigError(f"{path}: not valid YAML ({' '.join(str(err).split())})") from None
        if not isinstance(tree, dict):
            raise ConfigError(f"{path}: expected a mapping of sections (model, data, objective, train), "
                              f"got {type(tree).__name__}")
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key=value, e.g. train.lr=3e-4")
        key, value = item.split("=", 1)
        set_dotted(tree, key.strip(), yaml.safe_load(value))
    sections = {f.name for f in dataclasses.fields(PretrainConfig)}
    unknown = [k for k in tree if k not in sections]
    if unknown:
        raise ConfigError(f"{source}: unknown section {unknown[0]!r}; sections: {', '.join(sorted(sections))}")
    model = tree.get("model") or {}
    if not isinstance(model, dict) or not all(isinstance(k, str) for k in model):
        raise ConfigError(f"{source}: model: expected a mapping of ModelConfig field names (and preset) to values")
    if not isinstance(model.get("preset", ""), str):
        raise ConfigError(f"{source}: model.preset={model['preset']!r} must be a preset name")
    return PretrainConfig(model=dict(model),
                          data=_typed(DataConfig, tree.get("data") or {}, f"{source}: data"),
                          objective=_typed(ObjectiveConfig, tree.get("objective") or {}, f"{source}: objective"),
                          train=_typed(TrainArgs, tree.get("train") or {}, f"{source}: train"))


def _expand(pattern: str) -> list[str]:
    pattern = os.path.expandvars(os.path.expanduser(expand_data_root(pattern, "data.files")))
    found = sorted(glob.glob(pattern))
    if not found:
        raise FileNotFoundError(f"data.files: {pattern} matches no file")
    return found


def ensure_corpus(cfg: DataConfig, progress: bool = True) -> Path:
    """The prepared corpus directory, preparing it first from data.files when it does not exist yet."""
    from ..data.shards import prepare_corpus
    from ..tokenizers import load_tokenizer
    if not cfg.path:
        raise ConfigError("data.path is required: the directory of a prepared corpus (attnlab prepare --output)")
    path = Path(os.path.expandvars(cfg.path))
    if (path / "meta.json").exists():
        return path
    if not cfg.files or not cfg.tokenizer:
        raise FileNotFoundError(f"{path}: not a prepared corpus (no meta.json), and data.files / data.tokenizer "
                                "are not set to prepare one")
    files = [f for pattern in cfg.files for f in _expand(pattern)]
    if cfg.tokenizer == "char":
        from ..tokenizers import build_char_tokenizer
        tokenizer = build_char_tokenizer(files)
    elif cfg.tokenizer.startswith("bart-bpe:"):  # BART's byte-level BPE with fairseq's specials, learned here
        from ..tokenizers import train_tokenizer
        size = cfg.tokenizer.removeprefix("bart-bpe:")
        if not size.isdigit():
            raise ConfigError(f"data.tokenizer={cfg.tokenizer!r}: expected bart-bpe:N with N the vocabulary size")
        tokenizer = train_tokenizer("bart", files, int(size))
    else:
        tokenizer = load_tokenizer(os.path.expandvars(expand_data_root(cfg.tokenizer, "data.tokenizer")))
    prepare_corpus(tokenizer, files, path, documents=cfg.documents, raw=cfg.raw, heldout=cfg.heldout,
                   heldout_mode=cfg.heldout_mode, shard_tokens=cfg.shard_tokens, progress=progress,
                   tokenizer_source=cfg.tokenizer)
    return path


EMBEDDING_INITS = ("random", "ppmi")


def build_model_config(model: dict, tokenizer, seq_len: int) -> ModelConfig:
    values = dict(model)
    values.pop("embedding_init", None)
    name = values.pop("preset", None)
    if name in PRESETS and isinstance(values.get("extra"), dict):  # extra.KEY changes one key of the preset's
        values["extra"] = {**PRESETS[name].get("extra", {}), **values["extra"]}
    values.setdefault("vocab_size", tokenizer.vocab_size)
    values.setdefault("pad_token_id", tokenizer.pad_token_id)
    cfg = preset(name, **values) if name else ModelConfig.from_dict(values, source="model")
    if cfg.vocab_size < tokenizer.vocab_size:
        raise ConfigError(f"model.vocab_size={cfg.vocab_size} is smaller than the tokenizer's {tokenizer.vocab_size}")
    offset = cfg.extra.get("position_offset", 0)  # RoBERTa / BART tables hold 2 rows before the first position
    if cfg.position == "learned" and cfg.max_position_embeddings - offset < seq_len:
        raise ConfigError(f"model.max_position_embeddings={cfg.max_position_embeddings} < data.seq_len={seq_len}"
                          + (f" + position_offset {offset}" if offset else ""))
    return cfg


def pretrain(cfg: PretrainConfig) -> dict[str, float]:
    """Run (or resume, with train.resume=true) the recipe; returns the final evaluation metrics."""
    import torch

    from ..data.shards import open_shards
    from ..data.stream import BatchStream, fixed_batches
    from ..tokenizers import load_tokenizer
    rank, world, _ = distributed_context()
    if rank == 0:
        ensure_corpus(cfg.data, progress=cfg.train.progress)
    if world > 1:
        torch.distributed.barrier()
    corpus = ensure_corpus(cfg.data) if rank else Path(os.path.expandvars(cfg.data.path))
    tokenizer = load_tokenizer(corpus / "tokenizer")
    objective = build_objective(cfg.objective, tokenizer, cfg.data.seq_len)
    source = cfg.model.get("init_from")
    embedding_init = cfg.model.get("embedding_init", "random")
    if embedding_init not in EMBEDDING_INITS:
        raise ConfigError(f"model.embedding_init={embedding_init!r}: expected one of {', '.join(EMBEDDING_INITS)}")
    if source and objective.kind == "denoise":
        raise ConfigError("model.init_from continues masked-LM pretraining of an encoder; objective.kind=denoise "
                          "trains an encoder-decoder from scratch (model.preset: bart-base, ...)")
    if source and embedding_init != "random":
        raise ConfigError("model.embedding_init and model.init_from exclude each other: init_from brings its "
                          "own embeddings")
    if source:
        model = init_from(source, objective, tokenizer, cfg.model, cfg.data.seq_len, seed=cfg.train.seed,
                          verbose=rank == 0)
        model_cfg = model.config
    else:
        model_cfg = build_model_config(cfg.model, tokenizer, cfg.data.seq_len)
    if objective.kind == "clm" and not model_cfg.causal:
        raise ConfigError("objective.kind=clm needs a causal model (model.causal: true)")
    if objective.kind == "denoise" and not source:  # the tokenizer names the ids BART's decoder starts from
        model_cfg = model_cfg.replace(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                      extra={**model_cfg.extra, "decoder_start_token_id": tokenizer.eos_token_id})
    if objective.kind != "clm" and model_cfg.causal:
        raise ConfigError(f"objective.kind={objective.kind} needs a bidirectional model (model.causal: false)")
    if not source:
        torch.manual_seed(cfg.train.seed)  # the same initial weights on every rank and every run
        model = objective.model_class(model_cfg)
        if embedding_init == "ppmi" and not cfg.train.resume:
            init_seconds = ppmi_init(model, open_shards(corpus, "train"), seed=cfg.train.seed, verbose=rank == 0)

    slices = cfg.data.slices or world
    if slices % world:
        raise ConfigError(f"data.slices={slices} must be a multiple of the number of processes ({world})")
    train = BatchStream(open_shards(corpus, "train"), objective.examples, objective.collate, cfg.data.batch_size,
                        seed=cfg.train.seed, num_slices=slices, owned=list(range(rank, slices, world)))
    heldout = open_shards(corpus, "heldout")
    eval_data = fixed_batches(heldout, objective.examples, objective.collate, cfg.data.batch_size,
                              seed=cfg.train.seed, max_batches=cfg.data.eval_batches) if heldout else None
    if rank == 0:
        Path(cfg.train.output_dir).mkdir(parents=True, exist_ok=True)
        (Path(cfg.train.output_dir) / "config.yaml").write_text(yaml.safe_dump(
            {"model": cfg.model, "data": dataclasses.asdict(cfg.data),
             "objective": dataclasses.asdict(cfg.objective), "train": dataclasses.asdict(cfg.train)},
            sort_keys=False))
        tokenizer.save(Path(cfg.train.output_dir) / "tokenizer")
    metrics_fn = objective.metrics
    if eval_data and objective.kind.startswith("mlm"):
        # the same held-out masked tokens scored by word counts alone, logged next to every evaluation
        from ..data.shards import token_counts
        from ..objectives.mlm import unigram_baseline
        baseline = unigram_baseline(token_counts(open_shards(corpus, "train"), model_cfg.vocab_size), eval_data)
        metrics_fn = lambda sums: {**objective.metrics(sums), **baseline}  # noqa: E731
    if eval_data and objective.kind == "clm":
        # bits per byte beside val loss: comparable across tokenizers (char-level vs BPE)
        from ..objectives.clm import tokens_per_byte, with_bits_per_byte
        metrics_fn = with_bits_per_byte(metrics_fn, tokens_per_byte(heldout, tokenizer))
    trainer = Trainer(model, cfg.train, train, loss_fn=objective.loss, eval_data=eval_data, metrics_fn=metrics_fn)
    precision = trainer.precision  # train.precision=auto resolved for this machine
    ceiling = matmul_ceiling(model_cfg.hidden_size, precision=precision) if rank == 0 else 0.0
    metrics = trainer.train()
    if rank == 0:
        # measured again at the end, best of both: one reading taken during a load spike on a shared
        # machine once put the ceiling at a fifth of the CPU's and the MFU above 1
        ceiling = max(ceiling, matmul_ceiling(model_cfg.hidden_size, precision=precision))
        write_summary(cfg, model, trainer, metrics, ceiling, world,
                      extra={"embedding_init": embedding_init, "embedding_init_s": init_seconds}
                      if embedding_init != "random" and not cfg.train.resume else None)
    model = trainer.full_model()  # train.parallel=fsdp: gathered from the shards (every rank takes part)
    if rank == 0:
        # OUTPUT/model: weights + config + tokenizer in one directory, which every command takes as
        # MODEL (generate, viz, finetune, info) without digging through checkpoints/
        from ..interop.native import save_model
        final = Path(cfg.train.output_dir) / "model"
        if hasattr(model, "discriminator"):  # ELECTRA keeps the discriminator (+ model/generator)
            model.save(final)
        else:
            save_model(model, final)
        tokenizer.save(final)
        if source:  # a sentence-transformers source (all-MiniLM-L6-v2) keeps its pooling for finetune
            from ..interop.local import copy_sentence_modules
            copy_sentence_modules(source, final)
    return metrics


def ppmi_init(model, shards, seed: int = 0, verbose: bool = True) -> float:
    """Overwrite the token embedding (tied to the MLM decoder) with PPMI-SVD vectors of the training shards;
    returns the seconds it took (part of the recipe's time budget)."""
    import torch

    from ..data.cooccur import ppmi_embeddings
    start = time.perf_counter()
    table = getattr(model, "backbone", model).embeddings.tok.weight
    streams = (shard.tokens[:shard.num_tokens] for shard in shards)
    vectors = ppmi_embeddings(streams, table.shape[0], table.shape[1], seed=seed)
    with torch.no_grad():
        table.copy_(torch.from_numpy(vectors))
    seconds = time.perf_counter() - start
    if verbose:
        print(f"embedding_init ppmi: {table.shape[0]} x {table.shape[1]} from the training shards in {seconds:.0f} s",
              file=sys.stderr)
    return round(seconds, 1)


def init_from(directory: str, objective, tokenizer, model_section: dict, seq_len: int, seed: int = 0,
              verbose: bool = True):
    """The objective's model class built on the architecture of the checkpoint in `directory`, with
    every weight the checkpoint has (backbone, MLM head, NSP head); the heads it lacks start fresh.

    The checkpoint's vocabulary must be the corpus tokenizer's (same ids), else the embeddings would
    mean other words: continued pretraining keeps the vocabulary and changes the text."""
    from ..interop import load
    from ..tokenizers import load_tokenizer
    where = f"model.init_from={directory}"
    others = sorted(k for k in model_section if k != "init_from")
    if others:
        raise ConfigError(f"{where}: the architecture comes from the checkpoint; remove model.{others[0]}")
    path = Path(os.path.expandvars(os.path.expanduser(directory)))
    if not path.is_dir():
        raise FileNotFoundError(f"{where}: no such directory")
    try:
        theirs = load_tokenizer(path)
    except (OSError, ValueError):
        theirs = None  # a checkpoint without tokenizer files: only the size can be checked
    if theirs is not None and theirs.get_vocab() != tokenizer.get_vocab():
        raise ConfigError(f"{where}: its tokenizer differs from the corpus's (data.path's tokenizer/); "
                          "prepare the corpus with the checkpoint's tokenizer (attnlab prepare --tokenizer DIR)")
    src = load(path)
    if src.config.causal:
        raise ConfigError(f"{where}: a causal model; masked-LM pretraining needs a bidirectional encoder")
    if src.config.vocab_size < tokenizer.vocab_size:
        raise ConfigError(f"{where}: vocab_size={src.config.vocab_size} is smaller than the tokenizer's "
                          f"{tokenizer.vocab_size}")
    if src.config.position == "learned" and src.config.max_position_embeddings < seq_len:
        raise ConfigError(f"{where}: max_position_embeddings={src.config.max_position_embeddings} < "
                          f"data.seq_len={seq_len}")
    import torch
    torch.manual_seed(seed)  # fresh heads start the same on every rank and every run
    model = objective.model_class(src.config)
    state = src.state_dict()
    if not hasattr(src, "backbone"):  # a bare Encoder (BertModel): its weights are our backbone's
        state = {f"backbone.{k}": v for k, v in state.items()}
    mine = model.state_dict()
    wrong = [k for k in state if k in mine and state[k].shape != mine[k].shape]
    if wrong:
        raise ValueError(f"{where}: {wrong[0]} has shape {tuple(state[wrong[0]].shape)}, the model needs "
                         f"{tuple(mine[wrong[0]].shape)}")
    missing, _unused = model.load_state_dict({k: v for k, v in state.items() if k in mine}, strict=False)
    tied = {k for k in missing if k.endswith("mlm.decoder.weight")}  # re-tied to the embeddings below
    fresh = sorted(k for k in set(missing) - tied if not k.startswith(("mlm.", "nsp.", "backbone.pooler.")))
    if fresh:
        raise ValueError(f"{where}: the checkpoint has no {fresh[0]} (and {len(fresh) - 1} more backbone "
                         "weights): not an encoder of this architecture")
    model.tie_weights()
    heads = sorted({k.split(".")[0] if not k.startswith("backbone.") else "pooler" for k in set(missing) - tied})
    if verbose:
        print(f"init_from {path}: {type(src).__name__} -> {type(model).__name__}"
              + (f"; fresh: {', '.join(heads)}" if heads else ""), file=sys.stderr)
    return model


def matmul_ceiling(width: int, seconds: float = 1.0, precision: str = "fp32") -> float:
    """Measured GEMM rate (FLOP/s) of this machine at the current thread count, in the run's precision
    (bf16 matmuls are ~2x faster where the CPU has AVX512-BF16), on square matrices of a size the model's
    own matmuls have (the MFU denominator): best of a few timed runs."""
    import torch
    n = max(256, min(2048, 4 * width))
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    torch.mm(a, b)  # warm-up: thread pool and allocator
    best, t_end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        t = time.perf_counter()
        torch.mm(a, b)
        best = max(best, 2 * n ** 3 / (time.perf_counter() - t))
    return best


def train_flops_per_token(model, seq_len: int, mask_prob: float | None) -> float:
    """Forward + backward FLOPs per input token (6 per weight of every matmul a token passes, plus
    attention's scores and mixing, 12 * layers * seq_len * width; Kaplan et al. 2020). With sparse
    MLM prediction only the chosen share of tokens pays for the vocabulary projection."""
    import torch
    cfg, total = model.config, 0.0
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            share = mask_prob if (mask_prob is not None and name.startswith("mlm.")) else 1.0
            if name.startswith(("nsp.", "backbone.pooler")):
                share = 1.0 / seq_len  # once per sequence
            if ".experts." in name:  # a mixture of experts: each token passes top_k of the num_experts
                share = cfg.experts_top_k / cfg.num_experts
            total += 6 * module.weight.numel() * share
    return total + 12 * cfg.num_layers * seq_len * cfg.hidden_size


def write_summary(cfg: PretrainConfig, model, trainer, metrics: dict, ceiling: float, world: int,
                  extra: dict | None = None) -> None:
    """OUTPUT/summary.json: tokens seen, training tokens/s (median of the logged intervals, evaluations
    and checkpoints excluded), MFU against the measured matmul ceiling, load average, final metrics."""
    import json
    import statistics
    out = Path(cfg.train.output_dir)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    tps = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r]
    rate = statistics.median(tps) if tps else 0.0
    sparse = cfg.objective.sparse_prediction and cfg.objective.kind.startswith("mlm")
    flops = train_flops_per_token(model, cfg.data.seq_len, cfg.objective.mask_prob if sparse else None)
    import torch
    summary = {
        "steps": trainer.step,
        "tokens_seen": trainer.batches_seen * cfg.data.batch_size * cfg.data.seq_len * world,
        "tokens_per_s": round(rate, 1),
        "train_flops_per_token": flops,
        "matmul_ceiling_gflops": round(ceiling / 1e9, 2), "matmul_ceiling_precision": trainer.precision,
        "mfu": round(rate * flops / (ceiling * world), 4) if ceiling else None,
        "threads": torch.get_num_threads(), "processes": world,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "elapsed_s": rows[-1].get("elapsed_s") if rows and "elapsed_s" in rows[-1] else
        max((r.get("elapsed_s", 0) for r in rows), default=0),
        **(extra or {}),
        **{k: round(v, 6) for k, v in metrics.items()},
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"summary: {summary['tokens_per_s']:,.0f} tokens/s, MFU {summary['mfu']} of "
          f"{summary['matmul_ceiling_gflops']} GFLOP/s, load {summary['load_average']} -> {out / 'summary.json'}",
          file=sys.stderr)
