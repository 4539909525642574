"""Mixture of experts (issue 24): top-k routing over SwiGLU experts with renormalised weights, the
load-balancing loss as transformers computes it, the router z-loss, and the `mixtral` family with parity for
MixtralForCausalLM (logits, router_logits, aux_loss, loss) both ways; training adds the weighted aux loss and
reports each expert's share; `attnlab info` shows active vs total parameters; `attnlab generate` decodes."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from transformers import MixtralConfig, MixtralForCausalLM
from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

import attnlab
from attnlab.config import ConfigError, ModelConfig, preset
from attnlab.inference.generate import generate
from attnlab.inference.kv_cache import KVCache
from attnlab.nn.moe import MoEFeedForward, active_parameters, load_balancing_loss, router_z_loss
from attnlab.objectives.clm import clm_loss, clm_metrics
from _families import randomize

E, K = 4, 2


def tiny(**changes) -> ModelConfig:
    sizes = dict(vocab_size=61, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=24,
                 max_position_embeddings=64, num_experts=E, experts_top_k=K)
    return preset("mixtral-8x7b", **{**sizes, **changes})


def test_routing_is_top_k_with_renormalised_weights_over_swiglu_experts():
    torch.manual_seed(0)
    moe = MoEFeedForward(tiny())
    x = torch.randn(3, 5, 32)
    out = moe(x)
    h = x.reshape(-1, 32)
    probs = F.softmax(h @ moe.router.weight.t(), -1)
    want = torch.zeros_like(h)
    for n in range(h.size(0)):  # token by token: its k best experts, weights p_e / sum of the k p's
        top = probs[n].topk(K)
        for p, e in zip(top.values / top.values.sum(), top.indices):
            ex = moe.experts[int(e)]
            want[n] += p * ex.down(F.silu(ex.gate(h[n])) * ex.up(h[n]))
    assert torch.allclose(out.reshape(-1, 32), want, atol=1e-6)
    assert moe.router_logits.shape == (15, E)
    # a token's output uses only its k experts: zeroing another expert changes nothing for it
    idle = int(probs[0].topk(E).indices[-1])
    with torch.no_grad():
        moe.experts[idle].down.weight.zero_()
    assert torch.allclose(moe(x).reshape(-1, 32)[0], out.reshape(-1, 32)[0], atol=1e-6)


@pytest.mark.parametrize("masked", [False, True])
def test_load_balancing_loss_equals_transformers(masked):
    g = torch.Generator().manual_seed(2)
    logits = tuple(torch.randn(2 * 7, E, generator=g) for _ in range(3))
    mask = torch.ones(2, 7, dtype=torch.long)
    if masked:
        mask[1, 4:] = 0
    mask_arg = mask if masked else None
    want = load_balancing_loss_func(logits, E, K, mask_arg)
    assert abs(float(load_balancing_loss(logits, E, K, mask_arg)) - float(want)) <= 1e-6
    # balanced routing gives 1 (Fedus et al. 2021: the minimum); all tokens on the same experts give more
    balanced = (torch.eye(E).repeat(4, 1) * 5,)
    assert abs(float(load_balancing_loss(balanced, E, 1)) - 1.0) < 1e-4
    collapsed = (torch.tensor([[9.0, 8.0, 0.0, 0.0]]).repeat(16, 1),)
    assert float(load_balancing_loss(collapsed, E, K)) > 1.9


def test_router_z_loss_is_mean_squared_logsumexp():
    logits = (torch.tensor([[0.0, 0.0], [1.0, 3.0]]),)
    want = (torch.log(torch.tensor(2.0)) ** 2 + torch.logsumexp(torch.tensor([1.0, 3.0]), 0) ** 2) / 2
    assert torch.allclose(router_z_loss(logits), want)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    torch.manual_seed(0)
    cfg = MixtralConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=E, num_experts_per_tok=K,
                        sliding_window=8, max_position_embeddings=128, router_aux_loss_coef=0.02,
                        eos_token_id=None, bos_token_id=None)
    hf = randomize(MixtralForCausalLM(cfg))
    path = tmp_path_factory.mktemp("mixtral") / "hf"
    hf.save_pretrained(path)  # per-expert tensors (block_sparse_moe.experts.{j}.w1/w2/w3), as on the Hub
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a clean load: no missing or unused tensors
        ours = attnlab.load(path)
    return hf, ours


def compare(hf_model, ours, x, mask):
    labels = x.masked_fill(mask == 0, -100)  # nothing predicted from or at padding is scored
    labels[:, 1:] = labels[:, 1:].masked_fill(mask[:, :-1] == 0, -100)
    with torch.no_grad():
        a = hf_model(x, attention_mask=mask, labels=labels, output_router_logits=True)
        b = ours(x, attention_mask=mask, labels=labels)
    real = mask.bool()
    assert (a.logits - b.logits)[real].abs().max() <= 1e-5
    for ra, rb in zip(a.router_logits, b.router_logits, strict=True):  # padding rows: not routed (unpadded)
        assert (ra - rb)[real.flatten()].abs().max() <= 1e-5
    assert abs(float(a.aux_loss) - float(b.aux_loss)) <= 1e-5
    assert abs(float(a.loss) - float(b.loss)) <= 1e-5  # cross-entropy + 0.02 x aux_loss


def test_mixtral_parity_both_directions(pair, tmp_path):
    hf, ours = pair
    cfg = ours.config
    assert (cfg.model_type, cfg.num_experts, cfg.experts_top_k, cfg.router_aux_loss_coef, cfg.sliding_window) == \
        ("mixtral", E, K, 0.02, 8)
    x = torch.randint(0, 97, (3, 20), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(x)
    mask[1, :6] = 0  # left padding: the aux loss leaves padding out
    compare(hf, ours, x, mask)
    ours.save(tmp_path / "back")
    again, info = MixtralForCausalLM.from_pretrained(tmp_path / "back", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    compare(again.eval(), ours, x, mask)


def test_mixtral_cached_generation_equals_transformers(pair):
    hf, ours = pair
    prompt = torch.randint(0, 97, (2, 6), generator=torch.Generator().manual_seed(3))
    got = generate(ours, prompt, max_new_tokens=24, eos_token_id=[])
    want = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=24, do_sample=False)
    assert torch.equal(got, want)
    assert KVCache.for_model(ours).windows == [8, 8]  # Mixtral's window rolls its cache too


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="num_experts=1"):
        tiny(num_experts=1)
    with pytest.raises(ConfigError, match="experts_top_k=5"):
        tiny(experts_top_k=5)
    with pytest.raises(ConfigError, match="router_jitter_noise"):
        from attnlab.interop.mixtral import mixtral_config_from_hf
        mixtral_config_from_hf({"router_jitter_noise": 0.1, "hidden_size": 32, "num_attention_heads": 4})


def test_training_adds_weighted_aux_and_z_loss_and_reports_expert_shares():
    torch.manual_seed(0)
    model = attnlab.from_config(tiny(router_aux_loss_coef=0.1, router_z_loss_coef=0.01))
    batch = {"input_ids": torch.randint(0, 61, (2, 16)), "labels": torch.randint(0, 61, (2, 16))}
    loss, sums = clm_loss(model, batch)
    out = model(input_ids=batch["input_ids"])
    ce = F.cross_entropy(out.logits.flatten(0, 1), batch["labels"].flatten())
    want = ce + 0.1 * out.aux_loss + 0.01 * router_z_loss(out.router_logits)
    assert abs(loss.item() - want.item()) < 1e-5
    loss.backward()
    assert all(layer.ffn.router.weight.grad.abs().sum() > 0 for layer in model.backbone.layers)
    assert sum(float(sums[f"expert_{j}"]) for j in range(E)) == 2 * 16 * K * 2  # tokens x k x layers
    shares = {k: v for k, v in clm_metrics({k: float(v) for k, v in sums.items()}).items() if "share" in k}
    assert len(shares) == E and abs(sum(shares.values()) - 1) < 1e-9


def test_active_parameters_of_mixtral_8x7b():
    """The paper's numbers (Jiang et al. 2024, §1): 47B parameters, 13B active per token."""
    from attnlab.viz.explain import build_on_meta
    from attnlab.models.decoder import CausalLM
    active, total = active_parameters(build_on_meta(CausalLM, preset("mixtral-8x7b")))
    assert round(total / 1e9, 1) == 46.7 and round(active / 1e9, 1) == 12.9


def test_cli_info_and_generate_with_both_families(tmp_path, capsys):
    from attnlab.cli import main
    tok = attnlab.load_tokenizer("smollm2")
    for name in ("mistral-7b", "mixtral-8x7b"):
        torch.manual_seed(0)
        cfg = preset(name, vocab_size=len(tok), hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                     intermediate_size=32, max_position_embeddings=64, sliding_window=4,
                     **({"num_experts": E} if name.startswith("mixtral") else {}))
        path = attnlab.from_config(cfg).eval().save(tmp_path / name)
        tok.save(path)
        assert main(["generate", str(path), "--prompt", "Hello there", "--max-new-tokens", "12"]) == 0
        assert main(["info", str(path)]) == 0
        out = capsys.readouterr().out
        assert f"model_type={cfg.model_type}" in out
        assert ("parameters active per token" in out) == name.startswith("mixtral")


def test_trainer_logs_expert_shares_and_eval_shares(tmp_path):
    import json
    from attnlab.training import Trainer, TrainArgs
    torch.manual_seed(0)
    model = attnlab.from_config(tiny(router_aux_loss_coef=0.01))
    ids = torch.randint(0, 61, (4, 17))
    batches = [{"input_ids": ids[:, :-1], "labels": ids[:, 1:]}]
    args = TrainArgs(output_dir=str(tmp_path), max_steps=3, lr=1e-3, log_every=1, progress=False)
    Trainer(model, args, batches, loss_fn=clm_loss, eval_data=batches, metrics_fn=clm_metrics).train()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "expert_share" in r]
    assert len(train_rows) == 3 and all(len(r["expert_share"]) == E for r in train_rows)
    assert all(abs(sum(r["expert_share"]) - 1) < 1e-3 for r in train_rows)
    assert abs(sum(rows[-1][f"eval_expert_share_{j}"] for j in range(E)) - 1) < 1e-6
