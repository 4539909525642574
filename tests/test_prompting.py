"""Zero/few-shot prompting (attnlab/tasks/prompting.py): prompt layout, label scores equal to a direct
log-probability sum, and the CLI end to end on a tiny decoder."""
from __future__ import annotations

import json

import torch

import attnlab
from attnlab.cli import main
from attnlab.tasks.prompting import draw_demos, evaluate_prompting, kshot_prompt, label_scores

from _adapt import smol_tokenizer, tiny_llama_config


def test_kshot_prompt_layout_and_seeded_draws():
    demos = [("a fine film", "positive"), ("a bore", "negative")]
    assert kshot_prompt(demos, "so-so") == ("Review: a fine film\nSentiment: positive\n\nReview: a bore\nSentiment: "
                                            "negative\n\nReview: so-so\nSentiment:")
    assert kshot_prompt([], "so-so") == "Review: so-so\nSentiment:"
    pool = [(str(i), "positive") for i in range(20)]
    assert draw_demos(pool, 4, 1) == draw_demos(pool, 4, 1) != draw_demos(pool, 4, 2)


def test_label_scores_are_log_probabilities_of_the_label_words(tmp_path, capsys):
    tok = smol_tokenizer()
    torch.manual_seed(0)
    model = attnlab.from_config(tiny_llama_config(len(tok))).eval()
    prompts = ["Review: great\nSentiment:", "Review: a long dull mess of a film\nSentiment:"]
    got = label_scores(model, tok, prompts, ["negative", "positive"], pad_id=tok.pad_token_id)
    with torch.no_grad():
        for i, p in enumerate(prompts):
            for j, w in enumerate(["negative", "positive"]):
                ids_p = tok.encode(p, add_special_tokens=False)
                ids_w = tok.encode(" " + w, add_special_tokens=False)
                logp = model(torch.tensor([ids_p + ids_w])).logits[0].log_softmax(-1)
                want = sum(logp[len(ids_p) + t - 1, ids_w[t]].item() for t in range(len(ids_w)))
                assert abs(got[i, j].item() - want) <= 1e-4
    test = [("great", "positive"), ("awful", "negative"), ("fine", "positive")]
    res = evaluate_prompting(model, tok, test, test * 3, shots=(0, 2))
    assert set(res) == {0, 2} and all(0 <= r["accuracy"] <= 100 for r in res.values())
    # the CLI, on a saved tiny model and SST-2-format files
    attnlab.save(model, tmp_path / "m")
    tok.save(tmp_path / "m")
    (tmp_path / "t.tsv").write_text("sentence\tlabel\ngreat fun\t1\nawful\t0\n")
    assert main(["evaluate-prompting", "--model", str(tmp_path / "m"), "--data", str(tmp_path / "t.tsv"),
                 "--pool", str(tmp_path / "t.tsv"), "--shots", "0,1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["examples"] == 2 and {"0-shot", "1-shot"} <= set(out)
    assert main(["evaluate-prompting", "--model", str(tmp_path / "m"), "--data", str(tmp_path / "t.tsv"),
                 "--pool", str(tmp_path / "t.tsv"), "--shots", "5"]) == 1   # more shots than the pool holds


def test_shared_prefix_scores_equal_one_forward_per_prompt_and_word():
    """The demonstrations' KV cache computed once, rows left-padded in batches of 3, label words of one and of
    several tokens (two sharing all tokens but their last, so they share a row): the same log-probabilities as
    running every prompt + word through the model alone."""
    tok = smol_tokenizer()
    torch.manual_seed(1)
    model = attnlab.from_config(tiny_llama_config(len(tok), max_position_embeddings=256)).eval()
    demos = [("a fine film", "positive"), ("a bore", "negative")]
    prompts = [kshot_prompt(demos, t) for t in ["great", "a long and rather dull mess", "fine", "meh , ok I guess", "x"]]
    words = ["negative", "positive", "very good", "very bad"]
    assert len(tok.encode(" very good", add_special_tokens=False)) > 1
    got = label_scores(model, tok, prompts, words, batch_size=3, pad_id=tok.pad_token_id)
    with torch.no_grad():
        for i, p in enumerate(prompts):
            ids_p = tok.encode(p, add_special_tokens=False)
            for j, w in enumerate(words):
                ids_w = tok.encode(" " + w, add_special_tokens=False)
                logp = model(torch.tensor([ids_p + ids_w])).logits[0].log_softmax(-1)
                want = sum(logp[len(ids_p) + t - 1, ids_w[t]].item() for t in range(len(ids_w)))
                assert abs(got[i, j].item() - want) <= 1e-4, (i, w)
