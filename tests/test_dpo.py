"""DPO (attnlab/objectives/dpo.py): the paper's eq. 7 checked against hand computations, the sequence
log-probabilities against a direct sum, and the LoRA-disabled reference against a frozen copy."""
from __future__ import annotations

import copy
import math

import pytest
import torch

import attnlab
from attnlab.interop.peft import apply_lora
from attnlab.nn.lora import mark_only_adapters_trainable
from attnlab.objectives.dpo import (answer_example, dpo_batch_loss, dpo_loss, preference_batch,
                                    sequence_logprobs)

from _adapt import smol_tokenizer, tiny_llama_config


def test_eq7_by_hand():
    # log-ratios: chosen -1 - (-1.5) = 0.5, rejected -2 - (-1.5) = -0.5; beta 0.1 -> margin 0.1
    loss, chosen, rejected = dpo_loss(torch.tensor([-1.0]), torch.tensor([-2.0]), torch.tensor([-1.5]),
                                      torch.tensor([-1.5]), beta=0.1)
    assert abs(loss.item() - math.log(1 + math.exp(-0.1))) <= 1e-7          # -log sigmoid(0.1) = 0.644397
    assert abs(chosen.item() - 0.05) <= 1e-7 and abs(rejected.item() + 0.05) <= 1e-7
    # a batch is the mean of its examples; a policy that prefers the rejected answer pays more
    loss2, _, _ = dpo_loss(torch.tensor([-1.0, -3.0]), torch.tensor([-2.0, -1.0]), torch.tensor([-1.5, -2.0]),
                           torch.tensor([-1.5, -2.0]), beta=0.5)
    want = (math.log(1 + math.exp(-0.5 * 1.0)) + math.log(1 + math.exp(-0.5 * -2.0))) / 2
    assert abs(loss2.item() - want) <= 1e-6


class _Chars:
    """A character tokenizer: ids are code points mod 64 (enough for the tiny model here)."""
    def encode(self, text, add_special_tokens=False):
        return [ord(c) % 64 for c in text]


@pytest.fixture
def tiny():
    torch.manual_seed(0)
    return attnlab.from_config(tiny_llama_config(64, tie_word_embeddings=False)).eval()


def _batch():
    tok = _Chars()
    pairs = [("The film was ", "great fun", "dull"), ("A story ", "I loved", "that bores everyone")]
    return preference_batch([(answer_example(tok, p, c), answer_example(tok, p, r)) for p, c, r in pairs])


def test_sequence_logprobs_sum_the_answer_tokens_only(tiny):
    batch = _batch()
    got = sequence_logprobs(tiny, batch)
    with torch.no_grad():
        for i in range(batch["input_ids"].size(0)):
            n = int(batch["attention_mask"][i].sum())
            ids = batch["input_ids"][i, :n]
            logp = tiny(ids[None]).logits[0].log_softmax(-1)
            start = int((batch["labels"][i] != -100).nonzero()[0])    # first answer token
            want = sum(logp[t - 1, ids[t]].item() for t in range(start, n))
            assert abs(got[i].item() - want) <= 1e-4


def test_batch_loss_is_log2_at_the_start_and_matches_a_frozen_copy_later(tiny):
    batch = _batch()
    apply_lora(tiny, ["q", "v", "down"], r=4, alpha=8)
    loss, sums = dpo_batch_loss(tiny, batch, beta=0.1)
    assert abs(loss.item() - math.log(2)) <= 1e-6 and sums["reward_margin_sum"].abs().item() <= 1e-6  # B = 0
    reference = copy.deepcopy(tiny)      # the frozen starting point, taken before any step
    mark_only_adapters_trainable(tiny)
    opt = torch.optim.SGD([p for p in tiny.parameters() if p.requires_grad], lr=0.5)
    for _ in range(5):
        opt.zero_grad()
        dpo_batch_loss(tiny, batch, beta=0.1)[0].backward()
        opt.step()
    loss_a, sums_a = dpo_batch_loss(tiny, batch, beta=0.1)
    loss_b, _ = dpo_batch_loss(tiny, batch, beta=0.1, reference=reference)
    assert abs(loss_a.item() - loss_b.item()) <= 1e-6
    assert loss_a.item() < math.log(2) - 1e-3 and sums_a["reward_margin_sum"].item() > 0
    # and the value is eq. 7 on the four sequence log-probabilities
    with torch.no_grad():
        pol, ref = sequence_logprobs(tiny, batch), sequence_logprobs(reference, batch)
    margin = 0.1 * ((pol[:2] - ref[:2]) - (pol[2:] - ref[2:]))
    assert abs(loss_a.item() - torch.log1p(torch.exp(-margin)).mean().item()) <= 1e-6


def test_no_reference_and_no_adapter_is_an_error(tiny):
    with pytest.raises(ValueError, match="reference"):
        dpo_batch_loss(tiny, _batch())


def test_dpo_cli_with_lora_prefers_the_chosen_answers(tmp_path, capsys):
    import json

    from attnlab.cli import main
    from attnlab.interop.peft import load_adapter
    tok = smol_tokenizer()
    torch.manual_seed(0)
    attnlab.save(attnlab.from_config(tiny_llama_config(len(tok))), tmp_path / "base")
    tok.save(tmp_path / "base")
    prefs = [{"prompt": p, "chosen": " wonderful and moving.", "rejected": " dull and far too long."}
             for p in ("The film was", "I thought the play was", "Her new album is", "This book is")]
    (tmp_path / "prefs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prefs))
    assert main(["dpo", str(tmp_path / "base"), "--data", str(tmp_path / "prefs.jsonl"), "--output", str(tmp_path / "o"),
                 "--lora", "r=4,targets=q+v+o+up+down", "--max-steps", "15", "--lr", "5e-2", "--batch-size", "4",
                 "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["train_loss"] < math.log(2) - 0.05 and summary["train_reward_accuracy"] == 1.0
    # the saved adapter is the trained policy: it prefers the chosen answers more than the base does
    base, tuned = attnlab.load(tmp_path / "base"), load_adapter(attnlab.load(tmp_path / "base"), tmp_path / "o")
    pairs = [(answer_example(tok, p["prompt"], p["chosen"]), answer_example(tok, p["prompt"], p["rejected"])) for p in prefs]
    batch = preference_batch(pairs, pad_id=tok.pad_token_id)
    with torch.no_grad():
        lb, lt = sequence_logprobs(base, batch), sequence_logprobs(tuned, batch)
    assert ((lt[:4] - lt[4:]) - (lb[:4] - lb[4:])).min().item() > 0
    with pytest.raises(ValueError, match="prefs.jsonl:1"):
        (tmp_path / "prefs.jsonl").write_text('{"prompt": "x"}\n')
        from attnlab.training.dpo import read_preferences
        read_preferences(tmp_path / "prefs.jsonl")
