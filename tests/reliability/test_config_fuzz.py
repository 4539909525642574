"""Config files under fuzzing: whatever dict a JSON/YAML file holds, attnlab either builds a working model
from it or raises its own ConfigError naming the offending field (never a TypeError, KeyError, ... from
deep inside). Covers ModelConfig.from_dict, a Hugging Face config.json directory (every registered
family) and the pretraining YAML recipe (attnlab.training.pretrain.load_config)."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from hypothesis.errors import InvalidArgument
from hypothesis import HealthCheck, event, given, note, settings, strategies as st

from attnlab.config import ACTIVATIONS, ATTN_IMPLEMENTATIONS, NORMS, PLACEMENTS, POSITIONS, PRESETS, ConfigError, \
    ModelConfig
from attnlab.interop.hf import config_from_hf_dir
from attnlab.interop.registry import FAMILIES

# ATTNLAB_FUZZ_EXAMPLES=5000 for a longer hunt; 150 keeps the file under a minute on one thread
FUZZ = settings(max_examples=int(os.environ.get("ATTNLAB_FUZZ_EXAMPLES", 150)), deadline=None,
                suppress_health_check=list(HealthCheck))
FIELDS = [f.name for f in dataclasses.fields(ModelConfig)]

# --------------------------------------------------------------------------------- strategies
scalars = (st.none() | st.booleans() | st.integers(-3, 70) | st.integers() | st.floats(allow_nan=True)
           | st.floats(0, 1) | st.text(max_size=12) | st.sampled_from(POSITIONS + NORMS + PLACEMENTS + ACTIVATIONS
                                                                       + ATTN_IMPLEMENTATIONS))
junk = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                             max_size=3), max_leaves=8)
TINY_BASE = dict(vocab_size=40, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                 max_position_embeddings=32)
# plausible values for the fields, so that a fair share of the configs is valid and gets built
plausible = {
    "vocab_size": st.integers(1, 80), "hidden_size": st.sampled_from([8, 12, 16, 32]),
    "num_layers": st.integers(1, 2), "num_heads": st.sampled_from([1, 2, 4]),
    "num_kv_heads": st.sampled_from([None, 1, 2]), "head_dim": st.sampled_from([None, 4, 6, 8]),
    "intermediate_size": st.integers(1, 40), "max_position_embeddings": st.integers(1, 40),
    "type_vocab_size": st.integers(0, 3), "embedding_size": st.sampled_from([None, 4, 8]),
    "position": st.sampled_from(POSITIONS), "norm": st.sampled_from(NORMS),
    "norm_placement": st.sampled_from(PLACEMENTS), "activation": st.sampled_from(ACTIVATIONS),
    "sliding_window": st.sampled_from([None, 1, 3]), "attention_scale": st.sampled_from([None, 1.0, 0.5]),
    "dropout": st.floats(0, 0.99), "attention_dropout": st.floats(0, 0.99), "norm_eps": st.floats(1e-12, 1e-2),
    "initializer_range": st.floats(1e-4, 1.0), "rope_theta": st.floats(1.0, 1e6),
    "relative_num_buckets": st.integers(2, 40), "relative_max_distance": st.integers(1, 200),
    "pad_token_id": st.none() | st.integers(0, 5), "bos_token_id": st.none() | st.integers(0, 5),
    "eos_token_id": st.none() | st.integers(0, 5), "attn_implementation": st.sampled_from(ATTN_IMPLEMENTATIONS),
    "extra": st.dictionaries(st.text(max_size=6).filter(lambda k: not k.isidentifier()), junk, max_size=2),
}


@st.composite
def config_dicts(draw):
    names = draw(st.lists(st.sampled_from(FIELDS), unique=True, max_size=12))
    # usually on top of a tiny base (else BERT-base sizes fill the gaps, too large to build in a test)
    data = dict(TINY_BASE) if draw(st.integers(0, 4)) else {}
    for name in names:
        data[name] = draw(plausible[name]) if name in plausible and draw(st.integers(0, 3)) else draw(
            st.booleans() | junk)
    if draw(st.integers(0, 9)) == 0:  # now and then a key that is not a field
        data[draw(st.text(min_size=1, max_size=8))] = draw(junk)
    return data


# --------------------------------------------------------------------------------- checks
@contextlib.contextmanager
def file_holding(name: str, content: str | bytes):
    """A temporary file `name` holding `content` (str is written as UTF-8)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
        yield path


def outcome(what: str) -> None:
    """Count outcomes (pytest --hypothesis-show-statistics); a no-op outside a hypothesis test."""
    try:
        event(what)
    except InvalidArgument:
        pass


def small(cfg: ModelConfig) -> bool:
    return (cfg.vocab_size <= 100 and cfg.num_heads * cfg.dim_head <= 64 and cfg.hidden_size <= 64
            and cfg.num_layers <= 3 and cfg.intermediate_size <= 128 and cfg.emb_size <= 64
            and cfg.max_position_embeddings <= 128 and cfg.type_vocab_size <= 8
            and int(cfg.extra.get("num_decoder_layers") or cfg.num_layers) <= 3)


def build_and_run(cfg: ModelConfig, cls=None) -> None:
    """A valid config that is small enough is built and run forward on a few tokens."""
    from attnlab.models.decoder import CausalLM
    from attnlab.models.encoder import Encoder
    if not small(cfg):
        outcome("valid, too large to build")
        return
    outcome("valid, built and run")
    cls = cls or (CausalLM if cfg.causal else Encoder)
    torch.manual_seed(0)
    model = cls(cfg).eval()
    n = min(5, cfg.max_position_embeddings)
    ids = torch.randint(0, cfg.vocab_size, (2, n))
    with torch.no_grad():
        if hasattr(model, "encoder") and hasattr(model, "decoder"):  # encoder-decoder
            out = model(input_ids=ids, decoder_input_ids=ids)
        else:
            out = model(input_ids=ids)
    tensor = out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state
    assert torch.isfinite(tensor).all()


def names_a_field(err: ConfigError, data: dict) -> bool:
    message = str(err)
    return any(str(k) in message or repr(k) in message for k in data) or "expected a mapping" in message or "divide" in message


@FUZZ
@given(config_dicts())
def test_model_config_from_dict(data):
    note(repr(data))
    try:
        cfg = ModelConfig.from_dict(data)
    except ConfigError as err:
        assert names_a_field(err, data) or not data, str(err)
        assert "\n" not in str(err)
        outcome("ConfigError")
        return
    build_and_run(cfg)


@FUZZ
@given(st.one_of(junk, st.lists(st.integers()), st.text()))
def test_model_config_from_non_mapping(data):
    if isinstance(data, dict):
        try:
            ModelConfig.from_dict(data)
        except ConfigError:
            pass
        return
    with pytest.raises(ConfigError, match="expected a mapping"):
        ModelConfig.from_dict(data)


# --------------------------------------------------------------------------------- HF config.json
def _tiny_hf(model_type: str) -> dict:
    """A valid, tiny config.json for each family (from its preset, written by the family's own writer)."""
    if model_type == "gpt2":
        return dict(model_type="gpt2", vocab_size=50, n_embd=16, n_layer=1, n_head=2, n_positions=32,
                    architectures=["GPT2LMHeadModel"])
    if model_type == "llama":
        return dict(model_type="llama", vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                    architectures=["LlamaForCausalLM"])
    if model_type == "openai-gpt":  # GPT-1's FFN is always 4 * n_embd wide: the shared tiny shape below is not
        return dict(model_type="openai-gpt", vocab_size=50, n_embd=16, n_layer=1, n_head=2, n_positions=32,
                    architectures=["OpenAIGPTLMHeadModel"])
    name = next(n for n, p in PRESETS.items() if p["model_type"] == model_type)
    base = ModelConfig.from_dict(json.loads(json.dumps(PRESETS[name])))
    tiny = dict(vocab_size=50, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                max_position_embeddings=32)
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if getattr(base, key) is not None:
            tiny[key] = min(getattr(base, key), 3)
    for key in ("embedding_size", "head_dim"):
        if getattr(base, key) is not None:
            tiny[key] = 8
    if base.sliding_window:
        tiny["sliding_window"] = 5
    if base.disentangled_attention:  # DeBERTa: relative buckets must fit inside the tiny 32 positions
        tiny["position_buckets"] = 8
    if base.num_kv_heads is not None:  # GQA presets (Mistral, Mixtral): one key/value head for the tiny 2 heads
        tiny["num_kv_heads"] = 1
    extra = dict(base.extra)
    if "num_decoder_layers" in extra:
        extra["num_decoder_layers"] = 1
    for key in ("decoder_start_token_id",):
        if key in extra:
            extra[key] = min(extra[key], 3)
    cfg = base.replace(**tiny, extra=extra)
    return FAMILIES[model_type].config_to_hf(cfg)


TINY_HF = {t: _tiny_hf(t) for t in sorted(FAMILIES)}


@st.composite
def hf_dicts(draw):
    model_type = draw(st.sampled_from(sorted(FAMILIES)))
    data = dict(TINY_HF[model_type])
    keys = sorted(data)
    for key in draw(st.lists(st.sampled_from(keys), unique=True, max_size=draw(st.sampled_from([1, 1, 3])))):
        action = draw(st.integers(0, 2))
        if action == 0:
            del data[key]
        else:
            data[key] = draw(junk)
    for _ in range(draw(st.integers(0, 2))):
        data[draw(st.text(max_size=10))] = draw(junk)
    if draw(st.integers(0, 14)) == 0:
        data["model_type"] = draw(junk)
    return data


@FUZZ
@given(hf_dicts())
def test_hf_config_json(data):
    note(repr(data))
    with file_holding("config.json", json.dumps(data)) as path:
        try:
            cfg, hf = config_from_hf_dir(path.parent)
        except ConfigError as err:
            assert str(path) in str(err), str(err)
            assert "\n" not in str(err)
            outcome("ConfigError")
            return
    family = FAMILIES[cfg.model_type]
    arch = (hf.get("architectures") or [family.default_architecture])[0]
    cls = family.architectures.get(arch, family.architectures[family.default_architecture])[0]
    build_and_run(cfg, cls)


@FUZZ
@given(st.one_of(junk, st.text(), st.binary(max_size=20)))
def test_hf_config_json_not_an_object(content):
    with file_holding("config.json", content if isinstance(content, (str, bytes)) else json.dumps(content)) as path:
        try:
            config_from_hf_dir(path.parent)
        except ConfigError as err:
            assert str(path) in str(err)


def test_every_tiny_family_config_builds():
    for model_type, data in TINY_HF.items():
        with file_holding("config.json", json.dumps(data)) as path:
            cfg, _ = config_from_hf_dir(path.parent)
        family = FAMILIES[model_type]
        build_and_run(cfg, family.architectures[family.default_architecture][0])


# --------------------------------------------------------------------------------- pretrain YAML
SECTION_KEYS = {
    "data": ["path", "files", "tokenizer", "documents", "raw", "heldout", "seq_len", "batch_size", "slices"],
    "objective": ["kind", "mask_prob", "short_seq_prob"],
    "train": ["max_steps", "lr", "grad_accum", "schedule", "precision", "warmup_steps", "seed", "output_dir"],
    "model": ["preset", *FIELDS],
}


@st.composite
def recipes(draw):
    tree: dict = {}
    for section in draw(st.lists(st.sampled_from(sorted(SECTION_KEYS)), unique=True)):
        if draw(st.integers(0, 9)) == 0:
            tree[section] = draw(junk)
            continue
        body = {}
        for key in draw(st.lists(st.sampled_from(SECTION_KEYS[section]), unique=True, max_size=5)):
            body[key] = draw(st.sampled_from(sorted(PRESETS)) if key == "preset" else
                             (plausible[key] if key in plausible else junk) if draw(st.booleans()) else junk)
        tree[section] = body
    if draw(st.integers(0, 9)) == 0:
        tree[draw(st.text(max_size=6))] = draw(junk)
    return tree


@FUZZ
@given(recipes())
def test_pretrain_yaml(tree):
    note(repr(tree))
    from attnlab.training.pretrain import build_model_config, load_config
    with file_holding("recipe.yaml", yaml.safe_dump(tree, allow_unicode=True)) as path:
        try:
            cfg = load_config(path)
            model = build_model_config(cfg.model, SimpleNamespace(vocab_size=40, pad_token_id=0), cfg.data.seq_len)
        except ConfigError as err:
            model_keys = tree.get("model") if isinstance(tree.get("model"), dict) else {}
            assert str(path) in str(err) or names_a_field(err, model_keys), str(err)
            return
    assert isinstance(cfg.train.lr, float) and math.isfinite(cfg.train.lr)
    assert isinstance(cfg.data.batch_size, int) and isinstance(model, ModelConfig)


@FUZZ
@given(st.text(max_size=60) | st.binary(max_size=60))
def test_pretrain_yaml_garbage_text(content):
    from attnlab.training.pretrain import load_config
    with file_holding("recipe.yaml", content) as path:
        try:
            load_config(path)
        except ConfigError as err:
            assert str(path) in str(err)
