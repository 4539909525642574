"""The README's first Python example runs as written and shows the values its comments claim."""
from __future__ import annotations

import os
import re
from pathlib import Path

import torch

README = Path(__file__).resolve().parents[1] / "README.md"


def test_quickstart_example_runs_and_its_comments_hold(minilm, tmp_path, monkeypatch):
    block = re.search(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S).group(1)
    assert "attnlab.save(model, \"my-bert\")" in block and "# (2, 8, 384)" in block
    monkeypatch.chdir(tmp_path)  # attnlab.save writes my-bert/ here
    scope: dict = {}
    exec(compile(block, str(README), "exec"), scope)
    assert tuple(scope["out"].last_hidden_state.shape) == (2, 8, 384)
    assert len(scope["out"].attentions) == 6 and scope["out"].attentions[0].shape == (2, 12, 8, 8)
    saved = sorted(os.listdir(tmp_path / "my-bert"))
    assert saved == ["config.json", "model.safetensors"]
    import attnlab
    again = attnlab.load(tmp_path / "my-bert")
    with torch.no_grad():
        assert torch.equal(again(**scope["batch"]).last_hidden_state, scope["model"](**scope["batch"]).last_hidden_state)
