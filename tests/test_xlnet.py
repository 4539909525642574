"""XLNet (issue 23): two-stream attention with Transformer-XL relative positions, relative segments and mems
as `position: relative_xl` of the one Encoder; XLNetModel / XLNetLMHeadModel parity with transformers in both
directions; the permutation LM objective (objectives/plm.py): masks, a forward-pass leakage check, a
pretraining smoke."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import attnlab
from attnlab import preset
from attnlab.heads import PermutationLM
from attnlab.models import Encoder
from attnlab.objectives.plm import plm_collate, plm_masks, sample_permutation

transformers = pytest.importorskip("transformers")
V, T = 101, 9


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _hf(tmp_path: Path, name: str, cls=None, **overrides):
    """A random-init transformers XLNet with weights far from init scale (so that every term matters), saved."""
    kw = dict(vocab_size=V, d_model=32, n_layer=2, n_head=4, d_inner=48, mem_len=6, reuse_len=None)
    kw.update(overrides)
    torch.manual_seed(0)
    model = (cls or transformers.XLNetLMHeadModel)(transformers.XLNetConfig(**kw)).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "layer_norm" not in pname:
                p.normal_(0, 0.3 if p.dim() > 1 else 0.5)
    model.save_pretrained(tmp_path / name)
    return model, tmp_path / name


def _inputs(b: int = 3, t: int = T, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (b, t), generator=g)
    types = torch.randint(0, 3, (b, t), generator=g)
    perm = (torch.rand(b, t, t, generator=g) > 0.6).float()
    mapping = torch.zeros(b, 3, t)
    for row in range(b):
        for m, pos in enumerate(torch.randperm(t, generator=g)[:3]):
            mapping[row, m, pos] = 1.0
    mask = torch.ones(b, t, dtype=torch.long)
    mask[-1, -3:] = 0
    return ids, types, perm, mapping, mask


# several transformers configs; each run with and without two streams, masks, segments and mems. attn_type
# "uni" runs one row: transformers adds a per-row perm/padding mask into its causal mask in place, which
# fails to broadcast for a batch of more than one
CASES = {
    "bi": {},
    "uni-reuse": dict(attn_type="uni", reuse_len=4, mem_len=10),
    "clamp-relu-all-mems": dict(clamp_len=3, ff_activation="relu", mem_len=None),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_lm_head_parity_both_directions(tmp_path, case):
    hf, path = _hf(tmp_path, case, **CASES[case])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no missing / unused tensors
        ours = attnlab.load(path).eval()
    assert isinstance(ours, PermutationLM) and ours.config.causal == (case == "uni-reuse")
    b = 1 if case == "uni-reuse" else 3
    ids, types, perm, mapping, mask = _inputs(b)
    calls = [dict(), dict(token_type_ids=types, attention_mask=mask),
             dict(perm_mask=perm, target_mapping=mapping, token_type_ids=types),
             dict(perm_mask=perm, target_mapping=mapping, attention_mask=mask), dict(target_mapping=mapping)]
    with torch.no_grad():
        for kw in calls:
            a, o = hf(ids, **kw), ours(ids, **kw)
            assert o.logits.shape == a.logits.shape and o.logits.std() > 1.0, kw  # not a degenerate comparison
            assert (a.logits - o.logits).abs().max() <= 1e-5, kw
            assert len(o.mems) == 2 and all((x - y).abs().max() <= 1e-5 for x, y in zip(a.mems, o.mems))
            # the next segment reads the returned mems (segment recurrence), in both models
            nxt = torch.randint(0, V, (b, 5))
            a2 = hf(nxt, mems=a.mems, token_type_ids=torch.ones_like(nxt), perm_mask=perm[:, :5, :5])
            o2 = ours(nxt, mems=o.mems, token_type_ids=torch.ones_like(nxt), perm_mask=perm[:, :5, :5])
            assert (a2.logits - o2.logits).abs().max() <= 1e-5, kw
            assert [m.shape for m in o2.mems] == [m.shape for m in a2.mems]
            assert all((x - y).abs().max() <= 1e-5 for x, y in zip(a2.mems, o2.mems))
        labels = ids[:, :3].contiguous()
        kw = dict(perm_mask=perm, target_mapping=mapping, labels=labels)
        assert abs(hf(ids, **kw).loss.item() - ours(ids, **kw).loss.item()) <= 1e-5
    ours.save(tmp_path / "ours")
    back = transformers.XLNetLMHeadModel.from_pretrained(tmp_path / "ours").eval()
    assert back.config.attn_type == hf.config.attn_type and back.config.mem_len == hf.config.mem_len
    with torch.no_grad():
        kw = dict(perm_mask=perm, target_mapping=mapping, token_type_ids=types)
        assert (back(ids, **kw).logits - ours(ids, **kw).logits).abs().max() <= 1e-5


def test_backbone_parity_attentions_hidden_states_and_save(tmp_path):
    hf, path = _hf(tmp_path, "model", cls=transformers.XLNetModel)
    hf = transformers.XLNetModel.from_pretrained(path, attn_implementation="eager").eval()
    ours = attnlab.load(path).eval()
    assert type(ours) is Encoder and ours.hf_architecture == "XLNetModel"
    ids, types, perm, mapping, mask = _inputs()
    kw = dict(perm_mask=perm, target_mapping=mapping, token_type_ids=types, attention_mask=mask,
              output_attentions=True, output_hidden_states=True)
    with torch.no_grad():
        a, o = hf(ids, **kw), ours(ids, **kw)
    assert (a.last_hidden_state - o.last_hidden_state).abs().max() <= 1e-5
    assert len(o.hidden_states) == len(a.hidden_states) == 6  # (h, g) before each layer and after the last
    assert all((x - y).abs().max() <= 1e-5 for x, y in zip(a.hidden_states, o.hidden_states))
    for (ah, ag), (oh, og) in zip(a.attentions, o.attentions):  # the two streams' weights, separately
        assert (ah - oh).abs().max() <= 1e-5 and (ag - og).abs().max() <= 1e-5
    attnlab.save(ours, tmp_path / "ours")
    back = transformers.XLNetModel.from_pretrained(tmp_path / "ours").eval()
    with torch.no_grad():
        assert (back(ids, perm_mask=perm, target_mapping=mapping).last_hidden_state
                - ours(ids, perm_mask=perm, target_mapping=mapping).last_hidden_state).abs().max() <= 1e-5


def test_from_scratch_saves_for_transformers(tmp_path):
    torch.manual_seed(0)
    ours = PermutationLM(preset("xlnet-tiny", vocab_size=V, hidden_size=32, intermediate_size=40)).eval()
    ours.save(tmp_path / "m")
    back = transformers.XLNetLMHeadModel.from_pretrained(tmp_path / "m").eval()
    ids, types, perm, mapping, _ = _inputs()
    with torch.no_grad():
        a = ours(ids, perm_mask=perm, target_mapping=mapping, token_type_ids=types)
        b = back(ids, perm_mask=perm, target_mapping=mapping, token_type_ids=types)
    assert (a.logits - b.logits).abs().max() <= 1e-5 and back.config.mem_len == 64


def test_presets_count_transformers_parameters_and_info(capsys):
    from attnlab.cli import main
    with torch.device("meta"):
        base = transformers.XLNetLMHeadModel(transformers.XLNetConfig(d_model=768, n_layer=12, n_head=12, d_inner=3072))
        large = transformers.XLNetModel(transformers.XLNetConfig())
        assert PermutationLM(preset("xlnet-base-cased")).num_parameters() == base.num_parameters()  # 116,750,336
        assert Encoder(preset("xlnet-large-cased")).num_parameters() == large.num_parameters()
    assert main(["info", "xlnet-base-cased"]) in (0, None)
    out = capsys.readouterr().out
    assert "parameters: 116,718,336" in out and "relative W_r, u, v, segments 593,664" in out
    assert "query-stream start vector" in out and "relative positions" in out


def test_unsupported_xlnet_configs_are_named(tmp_path):
    from attnlab.config import ConfigError
    from attnlab.interop.xlnet import xlnet_config_from_hf
    with pytest.raises(ConfigError, match="bi_data=true is not supported"):
        xlnet_config_from_hf({"bi_data": True})
    with pytest.raises(ConfigError, match="attn_type='both'"):
        xlnet_config_from_hf({"attn_type": "both"})
    model = PermutationLM(preset("xlnet-tiny", vocab_size=V))
    with pytest.raises(ValueError, match=r"perm_mask has shape \(3, 4, 4\)"):
        model(torch.zeros(3, 5, dtype=torch.long), perm_mask=torch.zeros(3, 4, 4))
    with pytest.raises(ValueError, match="mems: expected 2 tensors"):
        model(torch.zeros(3, 5, dtype=torch.long), mems=[torch.zeros(4, 3, 128)])


# ----------------------------------------------------------------------------------- permutation LM
def _predecessors(order: np.ndarray, length: int, pos: int) -> set[int]:
    z = list(order[:length])
    return set(z[:z.index(pos)])


def test_plm_targets_see_exactly_their_predecessors():
    rng = np.random.default_rng(0)
    valid = np.ones((4, 24), dtype=bool)
    valid[2, 18:] = False  # a padded row
    s = sample_permutation(valid, 6, rng)
    perm, mapping = plm_masks(valid, s["rank"], s["num_predict"], s["targets"])
    assert s["num_predict"].tolist() == [4, 4, 3, 4]  # the last 1/6 of each order (24/6, 18/6)
    for b in range(4):
        length = int(valid[b].sum())
        assert sorted(s["order"][b, :length]) == list(range(length))  # a permutation of the real positions
        targets = [int(p) for p in s["targets"][b] if p >= 0]
        assert targets == list(s["order"][b, length - len(targets):length])  # the last of the order
        for m, pos in enumerate(targets):
            assert mapping[b, m].nonzero()[0].tolist() == [pos]
            sees = set(np.flatnonzero(perm[b, pos] == 0)) & set(range(length))  # the query stream's view
            assert sees == _predecessors(s["order"][b], length, pos) and pos not in sees
        context = [p for p in range(length) if p not in targets]
        for pos in context:  # context tokens see no target
            assert not (set(np.flatnonzero(perm[b, pos] == 0)) & set(targets))


def test_plm_forward_target_logits_ignore_non_predecessors():
    """Changing a target itself or a later target (in the order) leaves that target's logits unchanged, through
    both streams and every layer; changing a predecessor changes them."""
    torch.manual_seed(0)
    model = PermutationLM(preset("xlnet-tiny", vocab_size=V, num_layers=3, hidden_size=32, num_heads=2,
                                 intermediate_size=48)).eval()
    examples = [np.random.default_rng(i).integers(0, V, 18) for i in range(2)]
    batch = plm_collate(examples, np.random.default_rng(3), k=3)
    s = sample_permutation(np.ones((2, 18), dtype=bool), 3, np.random.default_rng(3))
    assert torch.equal(batch["labels"], torch.from_numpy(np.take_along_axis(np.stack(examples), s["targets"], 1)))
    inputs = {k: batch[k] for k in ("input_ids", "perm_mask", "target_mapping")}
    with torch.no_grad():
        base = model(**inputs).logits
        for b in range(2):
            targets, order = s["targets"][b].tolist(), s["order"][b].tolist()
            for m, pos in enumerate(targets):
                before = set(order[:order.index(pos)])
                for other in range(18):
                    ids = inputs["input_ids"].clone()
                    ids[b, other] = (ids[b, other] + 1) % V
                    moved = (model(**{**inputs, "input_ids": ids}).logits[b, m] - base[b, m]).abs().max()
                    assert (moved > 1e-6) == (other in before), (b, pos, other)


def test_plm_pretrain_smoke_lowers_loss(tmp_path, data_dir):
    from _pretrain_utils import sample_text

    from attnlab.data import prepare_corpus
    from attnlab.tokenizers import train_tokenizer
    from attnlab.training.pretrain import load_config, pretrain
    text = sample_text(data_dir, tmp_path / "text", chars_per_book=6000, books=3)
    files = sorted(text.iterdir())
    prepare_corpus(train_tokenizer("wordpiece", files, 400), files, tmp_path / "corpus", heldout=0.2,
                   shard_tokens=3000, progress=False)
    cfg = load_config(None, [
        f"data.path={tmp_path / 'corpus'}", "data.seq_len=32", "data.batch_size=16", "data.eval_batches=2",
        "model.preset=xlnet-tiny", "model.hidden_size=32", "model.num_heads=2", "model.intermediate_size=64",
        "model.dropout=0.0", "model.attention_dropout=0.0", "model.pad_token_id=0", "objective.kind=plm", "objective.plm_k=2",
        f"train.output_dir={tmp_path / 'run'}", "train.max_steps=60", "train.lr=3e-3", "train.warmup_steps=2",
        "train.log_every=5", "train.eval_every=60", "train.save_every=60", "train.progress=false"])
    metrics = pretrain(cfg)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if "loss" in r]
    # from ln(400) = 6.0; K = 2 (half of each order predicted) gives ~250 targets per batch, still noisy per step
    assert losses[0] > 5.5 and np.mean(losses[-3:]) < np.mean(losses[:2]) - 0.25, losses
    assert 0 < metrics["eval_loss"] < 5.6
    model = attnlab.load(tmp_path / "run" / "model")
    assert type(model) is PermutationLM and model.config.model_type == "xlnet"


def test_shipped_xlnet_recipe_builds():
    from attnlab.objectives import build_objective
    from attnlab.tokenizers import train_tokenizer
    from attnlab.training.pretrain import build_model_config, load_config
    repo = Path(__file__).resolve().parents[1]
    cfg = load_config(repo / "configs" / "pretrain-xlnet-mini.yaml")
    assert cfg.objective.kind == "plm" and cfg.objective.plm_k == 6
    tok = train_tokenizer("wordpiece", [repo / "README.md"], 300)
    model_cfg = build_model_config(cfg.model, tok, cfg.data.seq_len)
    assert build_objective(cfg.objective, tok, cfg.data.seq_len).model_class is PermutationLM
    assert (model_cfg.model_type, model_cfg.position, model_cfg.num_layers, model_cfg.hidden_size) == \
        ("xlnet", "relative_xl", 4, 256) and model_cfg.relative_segments


def test_viz_shows_the_two_streams_as_separate_pages(tmp_path):
    """attnlab viz on an XLNet: the query stream's weights follow the sampled order (no token sees itself or
    a later one), the content stream's add the diagonal; the neuron view recomputes both from q, k, bias."""
    from attnlab.viz.attention import extract, neuron_softmax
    torch.manual_seed(0)
    model = PermutationLM(preset("xlnet-tiny", vocab_size=V, hidden_size=32, intermediate_size=40)).eval()
    ids = torch.randint(0, V, (1, 7))
    order = [3, 0, 6, 1, 5, 2, 4]
    rank = torch.empty(7, dtype=torch.long)
    rank[torch.tensor(order)] = torch.arange(7)
    later = rank[None, :] >= rank[:, None]
    tokens = [f"t{i}" for i in range(7)]
    for stream in ("query", "content"):
        data = extract(model, ids, tokens, stream=stream, order=order)
        assert data.num_layers == 2
        for i, w in enumerate(data.layers):
            hidden = later & ~torch.eye(7, dtype=torch.bool) if stream == "content" else later
            rows = rank != 0  # the order's first token sees nothing in the query stream: a uniform row
            assert w[:, rows][:, hidden[rows]].abs().max() == 0 and torch.allclose(w.sum(-1), torch.ones(2, 7))
            assert (neuron_softmax(data, i) - w).abs().max() < 1e-5
        if stream == "content":
            assert (data.layers[0][:, torch.arange(7), torch.arange(7)] > 0).all()
    with pytest.raises(ValueError, match="needs a factorization order"):
        extract(model, ids, tokens, stream="query")


def test_gradients_match_and_every_attention_path_agrees(tmp_path):
    """The PLM loss's gradients equal transformers' (relative-position and segment parameters included), and
    the sdpa, eager and tiled attention paths give the same two-stream logits."""
    hf, path = _hf(tmp_path, "grad")
    ours = attnlab.load(path).eval()
    ids, types, perm, mapping, mask = _inputs()
    kw = dict(perm_mask=perm, target_mapping=mapping, token_type_ids=types, attention_mask=mask,
              labels=ids[:, :3].contiguous())
    hf(ids, **kw).loss.backward()
    ours(ids, **kw).loss.backward()
    theirs = dict(hf.named_parameters())
    for ours_name, hf_name, fix in [("backbone.layers.0.attn.xl.r_w_bias", "transformer.layer.0.rel_attn.r_w_bias", None),
                                    ("backbone.layers.1.attn.xl.seg_embed", "transformer.layer.1.rel_attn.seg_embed", None),
                                    ("backbone.layers.1.attn.xl.r.weight", "transformer.layer.1.rel_attn.r",
                                     lambda g: g.reshape(32, -1).t()),
                                    ("backbone.xl.mask_emb", "transformer.mask_emb", None),
                                    ("lm_head.bias", "lm_loss.bias", None)]:
        g_t = theirs[hf_name].grad
        g_t = fix(g_t) if fix else g_t
        g_o = dict(ours.named_parameters())[ours_name].grad
        assert g_o.abs().max() > 1e-3 and (g_o - g_t).abs().max() <= 1e-5, ours_name
    with torch.no_grad():
        ref = ours(ids, perm_mask=perm, target_mapping=mapping, token_type_ids=types).logits
        for impl in ("eager", "tiled"):
            other = PermutationLM(ours.config.replace(attn_implementation=impl)).eval()
            other.load_state_dict(ours.state_dict())
            out = other(ids, perm_mask=perm, target_mapping=mapping, token_type_ids=types).logits
            assert (out - ref).abs().max() <= 1e-5, impl


def test_a_damaged_projection_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    from attnlab.interop.files import CheckpointError
    _, path = _hf(tmp_path, "damaged")
    sd = load_file(path / "model.safetensors")
    sd["transformer.layer.1.rel_attn.r"] = torch.zeros(32, 32)  # (d_model, heads * head_dim): not XLNet's layout
    save_file(sd, path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"tensor transformer.layer.1.rel_attn.r: shape \(32, 32\); expected XLNet's"):
        attnlab.load(path)
