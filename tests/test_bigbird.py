"""BigBird (Zaheer et al. 2020): block-sparse attention computed blockwise (nn/block_sparse.py) equals its
dense-masked reference, and BigBirdModel / BigBirdForMaskedLM in block_sparse mode load with parity both
directions (transformers' eval mode draws no random blocks, so the comparison is deterministic)."""
import json

import pytest
import torch

import attnlab
from _families import padded_inputs, randomize, roundtrip
from attnlab.config import ConfigError, ModelConfig
from attnlab.interop.bigbird import bigbird_config_from_hf
from attnlab.nn.block_sparse import (block_counts, block_sparse_attention, dense_attention, draw_random_blocks,
                                     token_counts, uses_blocks)

transformers = pytest.importorskip("transformers")
TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=128, type_vocab_size=2, pad_token_id=0, block_size=4, num_random_blocks=2,
            attention_type="block_sparse")
SEQ = 75  # 19 blocks of 4 after transformers pads to whole blocks: > (5 + 2 * 2) blocks, so block-sparse runs


@pytest.mark.parametrize("arch,key", [("BigBirdModel", "last_hidden_state"), ("BigBirdForMaskedLM", "logits")])
def test_bigbird_parity_and_save_back(arch, key, tmp_path):
    torch.manual_seed(0)
    hf = randomize(getattr(transformers, arch)(transformers.BigBirdConfig(**TINY)))
    ids, mask = padded_inputs(99, 0, seq=SEQ)
    diff, back, ours = roundtrip(hf, tmp_path, key, key, dict(input_ids=ids, attention_mask=mask), mask)
    assert diff <= 1e-5 and back <= 1e-5, (diff, back)
    backbone = hf if arch == "BigBirdModel" else hf.bert
    assert backbone.attention_type == "block_sparse"  # transformers did not fall back to full attention
    assert ours.config.attention_kind == "block_sparse" and ours.config.sparse_block_size == 4
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert (saved["model_type"], saved["attention_type"], saved["block_size"], saved["num_random_blocks"]) == \
        ("big_bird", "block_sparse", 4, 2)
    # the sparse pattern mattered: full attention over the same weights gives other numbers
    full = type(ours)(ours.config.replace(attention_kind="softmax"))
    full.load_state_dict(ours.state_dict())
    with torch.no_grad():
        sparse_out = getattr(ours(ids, attention_mask=mask), key)
        full_out = getattr(full.eval()(ids, attention_mask=mask), key)
    assert (sparse_out - full_out)[mask.bool()].abs().max() > 1e-3


@pytest.mark.parametrize("impl", ["eager", "tiled"])
def test_backends_weights_and_original_full(impl, tmp_path):
    torch.manual_seed(0)
    hf = randomize(transformers.BigBirdModel(transformers.BigBirdConfig(**TINY)))
    hf.save_pretrained(tmp_path)
    base = attnlab.load(tmp_path)
    ours = attnlab.from_config(base.config.replace(attn_implementation=impl))
    ours.load_state_dict(base.state_dict())
    ids, mask = padded_inputs(99, 0, seq=SEQ)
    with torch.no_grad():
        want = hf(ids, attention_mask=mask).last_hidden_state
        got = ours.eval()(ids, attention_mask=mask, output_attentions=True)
    assert (want - got.last_hidden_state)[mask.bool()].abs().max() <= 1e-5
    # output_attentions gives the dense weights of the block pattern: zero outside it, rows sum to 1
    w = got.attentions[0][0, 0]
    assert w.shape == (SEQ, SEQ) and torch.allclose(w.sum(-1), torch.ones(SEQ), atol=1e-5)
    assert w[20, 40:60].abs().max() == 0 and w[20, :4].min() > 0  # outside the window / the global block
    # original_full is plain attention, and a short input falls back to it as transformers does
    full = transformers.BigBirdModel(transformers.BigBirdConfig(**{**TINY, "attention_type": "original_full"}))
    full.load_state_dict(hf.state_dict())
    full.save_pretrained(tmp_path / "full")
    plain = attnlab.load(tmp_path / "full").eval()
    assert plain.config.attention_kind == "softmax"
    short_ids, short_mask = ids[:, :30], mask[:, :30]  # 8 blocks after padding, not > (5 + 2 * 2): full
    with torch.no_grad():
        for model, x, m in ((plain, ids, mask), (ours, short_ids, short_mask)):
            want = full.eval()(x, attention_mask=m).last_hidden_state
            assert (want - model(x, attention_mask=m).last_hidden_state)[m.bool()].abs().max() <= 1e-5


def _qkv(b=2, h=3, t=48, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, t, d, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3)]


@pytest.mark.parametrize("drawn,chunk", [(False, 16), (True, 16), (True, 3)])
def test_blockwise_equals_dense_masked_reference(drawn, chunk, monkeypatch):
    monkeypatch.setattr("attnlab.nn.block_sparse.CHUNK", chunk)  # 3: the 10 middle blocks in 4 tiles
    block, r, t = 4, 2, 48  # 12 blocks
    q, k, v = _qkv(t=t)
    padding = torch.ones(2, t, dtype=torch.bool)
    padding[1, 37:] = False
    random = draw_random_blocks(t // block, r, 3, torch.Generator().manual_seed(3)) if drawn else None
    got = block_sparse_attention(q, k, v, padding, block, r, random)
    want, weights = dense_attention(q, k, v, padding, token_counts(t, block, r, random), q.size(-1) ** -0.5)
    real = padding[:, None, :, None].expand_as(got)
    assert (got - want)[real].abs().max() <= 1e-10
    dout = torch.randn_like(got).masked_fill(~real, 0.0)
    grads = torch.autograd.grad(got, (q, k, v), dout)
    want_grads = torch.autograd.grad(want, (q, k, v), dout)
    for a, b in zip(grads, want_grads):
        assert (a - b).abs().max() <= 1e-10
    # each middle query sees (5 + r) blocks' worth of weight slots: 3 window + 2 global + r random
    counts = block_counts(t // block, r, random)
    assert (counts[:, 5].sum(-1) == 5 + r).all() and (counts[:, 0] == 1).all()
    if drawn:  # random blocks are distinct, never global, never in the window: weights are 0/1 masks
        assert counts.max() == 1 and (counts[:, 1:-1].sum(-1) == torch.tensor([4 + r] + [5 + r] * 8 + [4 + r])).all()
        unseen = counts[:, 5].repeat_interleave(block, -1) == 0  # (H, T): keys outside query 20's blocks
        assert (weights[0, :, 20][unseen] == 0).all() and (weights[0, :, 20][~unseen] > 0).all()
    else:  # transformers' eval convention: the r random slots repeat block 0
        assert (counts[0, 1:-1, 0] == 1 + r).all()


def test_training_draws_random_blocks_and_short_inputs_are_full():
    cfg = ModelConfig(vocab_size=50, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                      attention_kind="block_sparse", sparse_block_size=4, num_random_blocks=1, dropout=0.0,
                      attention_dropout=0.0)
    model = attnlab.from_config(cfg)
    ids = torch.randint(3, 50, (1, 64))
    torch.manual_seed(0)
    a = model.train()(ids).last_hidden_state
    b = model(ids).last_hidden_state
    c = model.eval()(ids).last_hidden_state
    assert (a - b).abs().max() > 1e-6 and (a - c).abs().max() > 1e-6  # fresh random blocks per training call
    assert not uses_blocks(28, 4, 1) and uses_blocks(29, 4, 1)
    full = attnlab.from_config(cfg.replace(attention_kind="softmax"))
    full.load_state_dict(model.state_dict())
    short = ids[:, :28]
    assert torch.allclose(model(short).last_hidden_state, full.eval()(short).last_hidden_state, atol=1e-6)


def test_bad_configs_are_clear_errors():
    with pytest.raises(ConfigError, match="attention_type"):
        bigbird_config_from_hf({**TINY, "attention_type": "sparse"})
    with pytest.raises(ConfigError, match="block_sparse"):
        ModelConfig(attention_kind="block_sparse", causal=True)
    with pytest.raises(ConfigError, match="sparse_block_size"):
        ModelConfig(attention_kind="block_sparse", sparse_block_size=0)
    with pytest.raises(ValueError, match="multiple of block_size"):
        block_sparse_attention(*(x.detach() for x in _qkv(t=50)), None, 4, 1)


@pytest.mark.parametrize("kind", ["longformer", "bigbird"])
def test_viz_pattern_writes_the_recipes_mask(kind, minilm, tmp_path, capsys):
    """`attnlab viz --pattern` draws the model's own mask: the window + global rows/columns of Longformer,
    BigBird's blocks (the same matrix nn/block_sparse.py attends with)."""
    from attnlab.cli import main
    from attnlab.interop.native import save_model
    from attnlab.nn.attention import AttentionMask
    from attnlab.viz.patterns import attention_pattern
    switches = dict(sliding_window=3, global_attention=True) if kind == "longformer" else \
        dict(attention_kind="block_sparse", sparse_block_size=2, num_random_blocks=1)
    cfg = ModelConfig(vocab_size=30522, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                      max_position_embeddings=64, **switches)
    save_model(attnlab.from_config(cfg), tmp_path / kind)
    attnlab.load_tokenizer(minilm).save(tmp_path / kind)
    text = "the quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat all day"
    out = tmp_path / f"{kind}.png"
    glob = ["--global-tokens", "0,5"] if kind == "longformer" else []
    assert main(["viz", str(tmp_path / kind), "--text", text, "--pattern", *glob, "--output", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "wrote" in capsys.readouterr().out
    t = 21  # [CLS] + 19 words + [SEP]
    allowed, _ = attention_pattern(cfg, t, [0, 5] if kind == "longformer" else None)
    if kind == "longformer":
        glob = torch.zeros(1, t, dtype=torch.bool)
        glob[0, [0, 5]] = True
        want = AttentionMask.build(None, t, t, window=3, global_tokens=glob, device="cpu").allowed[0, 0]
        assert allowed[5].all() and allowed[:, 5].all() and not allowed[10, 14]
    else:  # 11 blocks of 2 (t padded to 22), random blocks drawn with seed 0 for head 0
        random = draw_random_blocks(11, 1, 1, torch.Generator().manual_seed(0))
        want = token_counts(22, 2, 1, random)[0, :t, :t] > 0
        assert allowed[0].all() and allowed[:, 0].all() and allowed[:, 20].all() and not allowed[10].all()
    assert torch.equal(allowed, want)
    assert main(["viz", str(tmp_path / kind), "--text", text, "--pattern", "--global-tokens", "99",
                 "--output", str(out)]) == 1  # outside the input / BigBird chooses its own global blocks
    assert "--global-tokens" in capsys.readouterr().err
