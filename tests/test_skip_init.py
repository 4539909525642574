"""Loading a checkpoint skips the random initialisation it would overwrite (models/base.py `skip_init`), and
only then: the loaded model equals one built the slow way, ties hold, and a part the checkpoint lacks (a new
head) still gets its initialisation."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import attnlab
import attnlab.interop  # noqa: F401  (sets the checkpoint writer models save through)
from attnlab.config import ModelConfig, preset
from attnlab.models.base import skip_init
from attnlab.models.decoder import CausalLM
from attnlab.models.encoder import Encoder


def _tiny_lm() -> CausalLM:
    torch.manual_seed(0)
    return CausalLM(preset("mistral-7b", vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64,
                           max_position_embeddings=32, tie_word_embeddings=True)).eval()


def test_loaded_model_equals_the_saved_one_and_keeps_its_ties(tmp_path):
    ours = _tiny_lm()
    ours.save(tmp_path / "m")
    back = attnlab.load(tmp_path / "m")
    want = ours.state_dict()
    got = back.state_dict()
    assert set(got) == set(want)
    for k in want:
        assert torch.equal(got[k], want[k]), k
    assert back.lm_head.weight is back.backbone.embeddings.tok.weight  # the tie, made though init was skipped
    ids = torch.randint(0, 64, (2, 9))
    with torch.no_grad():
        assert torch.equal(back(input_ids=ids).logits, ours(input_ids=ids).logits)


def test_a_head_the_checkpoint_lacks_is_initialised(tmp_path):
    torch.manual_seed(1)
    cfg = ModelConfig(model_type="bert", vocab_size=64, hidden_size=32, num_layers=2, num_heads=4,
                      intermediate_size=64, max_position_embeddings=32)
    Encoder(cfg).save(tmp_path / "bert")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf = attnlab.load(tmp_path / "bert", architecture="BertForSequenceClassification")
    w = clf.classifier.weight
    std = cfg.initializer_range
    assert torch.isfinite(w).all() and 0.5 * std < float(w.detach().std()) < 1.5 * std
    assert torch.equal(clf.classifier.bias.detach(), torch.zeros_like(clf.classifier.bias))


def test_skip_init_puts_torch_init_back():
    before = {n: getattr(nn.init, n) for n in ("normal_", "uniform_", "kaiming_uniform_", "zeros_")}
    with pytest.raises(RuntimeError):
        with skip_init():
            with skip_init():  # nested: the inner one is a no-op
                lin = nn.Linear(8, 8)
            raise RuntimeError("boom")
    assert {n: getattr(nn.init, n) for n in before} == before
    torch.manual_seed(0)
    fresh = nn.Linear(64, 64)
    assert float(fresh.weight.detach().std()) > 0.01  # initialisation works again after the block
    assert lin.weight.shape == (8, 8)


def test_another_thread_still_initialises_while_one_skips():
    """skip_init is per thread: a model built in another thread meanwhile gets torch's initialisation (the same
    draws as without any skip), and the thread inside skips; torch.nn.init is whole again once both are out."""
    import threading
    torch.manual_seed(0)
    want = nn.Linear(16, 16).weight.detach().clone()
    before = nn.init.kaiming_uniform_
    inside, done = threading.Event(), threading.Event()
    state: dict = {}

    def skipper():
        with skip_init():
            rng = torch.get_rng_state()
            nn.Linear(16, 16)
            state["drew"] = not torch.equal(rng, torch.get_rng_state())
            inside.set()
            done.wait(10)

    t = threading.Thread(target=skipper)
    t.start()
    try:
        assert inside.wait(10)
        torch.manual_seed(0)
        got = nn.Linear(16, 16).weight.detach()
    finally:
        done.set()
        t.join()
    assert torch.equal(got, want)
    assert state["drew"] is False  # the thread inside skip_init drew no random numbers
    assert nn.init.kaiming_uniform_ is before


def test_sentence_transformers_checkpoint_loads_like_the_slow_path(minilm):
    fast = attnlab.load(minilm)
    from attnlab.interop import hf
    from attnlab.interop.files import read_state_dict
    config, raw = hf.config_from_hf_dir(minilm)
    family = hf.FAMILIES[config.model_type]
    arch = (raw.get("architectures") or [family.default_architecture])[0]
    cls, rows = family.architectures[arch if arch in family.architectures else family.default_architecture]
    slow = cls(config)
    sd, source = read_state_dict(minilm)
    hf.load_hf_state_dict(slow, sd, family, rows, source)
    for (k, a), (_, b) in zip(fast.state_dict().items(), slow.state_dict().items()):
        assert torch.equal(a, b), k
