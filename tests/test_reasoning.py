"""Chain of thought and self-consistency (attnlab/tasks/reasoning.py): the generated problems' answers, the
prompt layouts, answer extraction, the vote, and `evaluate-prompting --task arithmetic` on a tiny decoder."""
from __future__ import annotations

import json
import re

import pytest
import torch

import attnlab
from attnlab.cli import main
from attnlab.inference.generate import encode_prompts, generate
from attnlab.tasks.reasoning import (Problem, arithmetic_problems, arithmetic_prompt, evaluate_arithmetic,
                                     extract_answer, majority_vote)

from _adapt import smol_tokenizer, tiny_llama_config


def test_problems_are_seeded_and_their_steps_compute_the_answer():
    problems = arithmetic_problems(60, seed=3)
    assert problems == arithmetic_problems(60, seed=3) != arithmetic_problems(60, seed=4)
    for p in problems:
        assert p.steps.endswith(f"The answer is {p.answer}.") and p.answer >= 0
        # every "x op y = z" step of the worked solution is right, and its last result is the answer
        steps = re.findall(r"(\d+) ([-+*]) (\d+) = (\d+)", p.steps)
        assert len(steps) == 2
        for x, op, y, z in steps:
            assert eval(f"{x} {op} {y}") == int(z)
        assert int(steps[-1][3]) == p.answer
    assert len({p.question for p in problems}) > 50


def test_prompt_layouts():
    shot = Problem("Q1?", "1 + 1 = 2. The answer is 2.", 2)
    assert arithmetic_prompt([shot], "Q2?", "cot") == "Q: Q1?\nA: 1 + 1 = 2. The answer is 2.\n\nQ: Q2?\nA:"
    assert arithmetic_prompt([shot], "Q2?", "direct") == "Q: Q1?\nA: The answer is 2.\n\nQ: Q2?\nA:"
    assert arithmetic_prompt([shot], "Q2?", "self-consistency") == arithmetic_prompt([shot], "Q2?", "cot")
    with pytest.raises(ValueError, match="mode 'tot'"):
        arithmetic_prompt([], "Q?", "tot")


@pytest.mark.parametrize("text, want", [
    ("4 + 3 = 7. 7 - 2 = 5. The answer is 5.", 5),
    ("The answer is 1,200 apples.", 1200),
    ("So the answer is: -3", -3),
    ("The answer is $12.", 12),
    ("4 + 3 = 7. 7 - 2 = 5.", 5),                       # no sentence: the last number
    ("The answer is 8.\nQ: Tom has 9 pens", 8),
    ("3 + 4 = 7\nQ: Ana has 2 books. The answer is 2.", 7),   # text after the model starts a new question is ignored
    ("I do not know.", None),
    ("", None),
])
def test_extract_answer(text, want):
    assert extract_answer(text) == want


def test_majority_vote():
    assert majority_vote([3, None, 4, 3]) == 3
    assert majority_vote([4, 3, 3, 4]) == 4            # a tie goes to the answer seen first
    assert majority_vote([None, 6]) == 6
    assert majority_vote([None, None]) is None and majority_vote([]) is None


def test_evaluate_arithmetic_on_a_tiny_decoder(tmp_path, capsys):
    tok = smol_tokenizer()
    torch.manual_seed(0)
    model = attnlab.from_config(tiny_llama_config(len(tok), max_position_embeddings=512)).eval()
    problems, shots = arithmetic_problems(3, seed=0), arithmetic_problems(1, seed=1)
    res = evaluate_arithmetic(model, tok, problems, shots, samples=3, temperature=1.0, max_new_tokens=6, batch_size=4)
    assert set(res) == {"direct", "cot", "self-consistency"}
    for mode, r in res.items():
        assert len(r["outputs"]) == 3
        correct = sum(o["answer"] == p.answer for o, p in zip(r["outputs"], problems))
        assert r["accuracy"] == round(100 * correct / 3, 1)
    # greedy chain of thought is exactly what generate() writes after the prompt, cut at a blank line
    prompt = arithmetic_prompt(shots, problems[0].question, "cot")
    ids, mask = encode_prompts(tok, [prompt])
    text = tok.decode(generate(model, ids, mask, max_new_tokens=6)[0, ids.size(1):].tolist(), skip_special_tokens=True)
    assert res["cot"]["outputs"][0]["text"] == text.split("\n\n")[0].strip()
    sc = res["self-consistency"]
    assert sc["samples"] == 3 and sc["temperature"] == 1.0
    for o in sc["outputs"]:
        assert len(o["paths"]) == 3 and o["answer"] == majority_vote(o["paths"])
    again = evaluate_arithmetic(model, tok, problems, shots, ["self-consistency"], samples=3, temperature=1.0,
                                max_new_tokens=6, batch_size=4)
    assert again["self-consistency"]["outputs"] == sc["outputs"]   # the seed fixes the sampled paths

    attnlab.save(model, tmp_path / "m")
    tok.save(tmp_path / "m")
    argv = ["evaluate-prompting", "--model", str(tmp_path / "m"), "--task", "arithmetic", "--problems", "2",
            "--shots", "1", "--samples", "2", "--max-new-tokens", "4", "--output", str(tmp_path / "r.json")]
    assert main(argv + ["--mode", "cot,self-consistency"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["problems"] == 2 and set(out) >= {"cot", "self-consistency"} and "direct" not in out
    assert "outputs" not in out["cot"] and len(json.loads((tmp_path / "r.json").read_text())["cot"]["outputs"]) == 2
    with pytest.raises(SystemExit) as bad:
        main(argv + ["--mode", "cot,tree"])
    assert bad.value.code == 2 and "cot,tree" in capsys.readouterr().err
    assert main(argv[:-2] + ["--samples", "0"]) == 1
    assert "--samples 0" in capsys.readouterr().err
