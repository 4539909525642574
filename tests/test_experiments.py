"""`attnlab experiment`: every experiment runs on tiny settings and writes its table, verdict and plot;
the measurements behind the verdicts are checked where they have a known answer."""
from __future__ import annotations

import json

import numpy as np
import pytest

from attnlab.cli import main
from attnlab.experiments import EXPERIMENTS, listing, run
from attnlab.experiments.parallel import lstm_hidden_for
from attnlab.experiments.senses import sense_scores
from attnlab.experiments.sqrt_dk import measure
from attnlab.experiments.vocab_overlap import overlap


def _written(tmp_path, name):
    md = (tmp_path / f"{name}.md").read_text()
    data = json.loads((tmp_path / f"{name}.json").read_text())
    png = (tmp_path / f"{name}.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 2000
    assert "**Verdict:" in md and data["verdict"] in md and data["holds"] in (True, False, None)
    assert data["rows"] and all(len(r) == len(data["columns"]) for r in data["rows"])
    return md, data


def test_list_names_every_experiment_with_its_claim(capsys):
    assert main(["experiment", "--list"]) == 0
    out = capsys.readouterr().out
    assert [line.split()[0] for line in out.splitlines()] == list(EXPERIMENTS)
    assert all(claim for _, claim in listing())


def test_unknown_experiment_is_one_clear_line(capsys, tmp_path):
    assert main(["experiment", "nope", "--output", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "unknown experiment 'nope'" in err and "sqrt-dk" in err


def test_sqrt_dk_scaling_keeps_entropy_and_unscaled_collapses(tmp_path):
    # the measurement itself: scaled logits have unit std at any d_k; unscaled grow as sqrt(d_k)
    assert measure(1024, True)["logit_std"] == pytest.approx(1.0, abs=0.05)
    assert measure(1024, False)["logit_std"] == pytest.approx(32.0, rel=0.05)
    md, data = _written(tmp_path, run("sqrt-dk", tmp_path, tiny=True).name)
    assert "attnlab experiment sqrt-dk --tiny" in md
    entropy_scaled, entropy_unscaled = data["rows"][-1][3], data["rows"][-1][4]
    assert entropy_unscaled < entropy_scaled


def test_parallel_runs_and_sizes_the_lstm_to_equal_parameters(tmp_path):
    width, params = 256, 790_000
    h = lstm_hidden_for(params, width)
    assert abs(4 * h * (width + h) + 8 * h - params) < 4 * (width + 2 * h) + 8  # nearest integer h
    report = run("parallel", tmp_path, tiny=True)
    _written(tmp_path, "parallel")
    s = report.settings
    assert abs(s["lstm_params"] - s["transformer_params"]) / s["transformer_params"] < 0.03


def test_sense_scores_on_a_hand_made_case():
    # two senses, two occurrences each: identical vectors within a sense, orthogonal across
    vecs = np.array([[1.0, 0], [1.0, 0], [0, 1.0], [0, 1.0]])
    within, across, nn = sense_scores(vecs, [0, 0, 1, 1])
    assert (within, across, nn) == (1.0, 0.0, 1.0)
    # a static representation: all equal, the nearest occurrence is chance (1 of the 3 others)
    within, across, nn = sense_scores(np.ones((4, 2)), [0, 0, 1, 1])
    assert within == pytest.approx(across) and nn == pytest.approx(1 / 3)


def test_senses_static_cannot_separate_contextual_does(tmp_path, data_dir, minilm):
    _, data = _written(tmp_path, run("senses", tmp_path, tiny=True, data=data_dir).name)
    gap = {(r[0], r[1]): r[4] for r in data["rows"]}
    assert gap[("bank", "word2vec")] == 0
    assert gap[("bank", "MiniLM last layer")] > gap[("bank", "MiniLM embedding layer")]


def test_vocab_overlap_ignores_special_and_unused_tokens(tmp_path, data_dir):
    assert overlap({"the", "cat"}, {"the", "dog", "[unused1]", "[CLS]"}) == pytest.approx(0.5)
    _, data = _written(tmp_path, run("vocab-overlap", tmp_path, tiny=True, data=data_dir).name)
    assert data["rows"][0][1] <= 2000


def test_head_pattern_masks_on_a_hand_made_sentence():
    from attnlab.experiments.heads import pattern_masks
    # [CLS] play ##ing now [SEP]: word ids None 0 0 1 None
    m = pattern_masks([None, 0, 0, 1, None])
    assert m["[CLS]"][:, 0].all() and m["[SEP]"][:, 4].all()
    assert m["previous token"][2, 1] and not m["previous token"][0].any()
    assert m["next token"][3, 4] and m["same word"][1, 2] and m["same word"][2, 1]
    assert m["same word"].sum() == 2


def test_heads_writes_pattern_maps_and_layer_probes(tmp_path, data_dir, minilm):
    md, data = _written(tmp_path, run("heads", tmp_path, tiny=True, data=data_dir).name)
    assert [r[0] for r in data["rows"]] == ["[CLS]", "[SEP]", "previous token", "next token", "same word"]
    probe_rows = data["tables"][0][2]
    assert len(probe_rows) == 7 and all(0 <= r[1] <= 1 for r in probe_rows)  # embeddings + 6 layers
    assert (tmp_path / "heads-probe.png").exists()


def test_power_law_fit_recovers_a_known_exponent():
    from attnlab.experiments.scaling import fit_power_law
    n = [1e3, 1e4, 1e5, 1e6]
    alpha, a, r2 = fit_power_law(n, [3.0 * x ** -0.1 for x in n])
    assert alpha == pytest.approx(0.1) and a == pytest.approx(3.0) and r2 == pytest.approx(1.0)


@pytest.mark.parametrize("name", ["warmup", "positions", "activations", "gqa", "scaling"])
def test_character_recipe_experiments_run_tiny(tmp_path, data_dir, name):
    """Each trains the tiny character GPT per setting (real `attnlab pretrain` runs) and reports."""
    _, data = _written(tmp_path, run(name, tmp_path, tiny=True, data=data_dir).name)
    losses = [r[c] for r in data["rows"] for c, col in enumerate(data["columns"]) if col == "val loss"]
    assert all(isinstance(x, float) and 0 < x < 10 for x in losses)
    recipes = list((tmp_path / "runs").glob("*/recipe.yaml"))
    assert len(recipes) == len(data["rows"])  # one real run per row


def test_bottleneck_trains_three_translators_and_scores_by_length(tmp_path):
    _, data = _written(tmp_path, run("bottleneck", tmp_path, tiny=True).name)
    assert [r[0] for r in data["rows"]] == ["RNN, no attention", "RNN + attention (Bahdanau)", "Transformer"]
    assert all(r[2] > 0 and 0 <= r[4] <= 100 for r in data["rows"])  # trained steps, a BLEU score


def test_objectives_pretrains_three_ways_and_fine_tunes_each(tmp_path, data_dir):
    _, data = _written(tmp_path, run("objectives", tmp_path, tiny=True, data=data_dir).name)
    assert [r[0] for r in data["rows"]] == ["MLM", "MLM + NSP", "ELECTRA", "no pretraining (random init)"]
    assert all(0 <= r[6] <= 100 for r in data["rows"])  # SST-2 accuracy
    mlm = data["rows"][0]
    assert 0 <= mlm[4] <= 1 and 0 <= mlm[5] <= 1  # held-out MLM accuracy beside the unigram baseline's
    assert data["holds"] in (True, False, None) and "SST-2 with 40 labels" in data["verdict"]
    assert (tmp_path / "finetune" / "curve.json").exists()


def test_index_gathers_the_runs_in_the_notes_order(tmp_path, capsys):
    assert main(["experiment", "--index", "--output", str(tmp_path)]) == 1  # nothing to index yet
    assert "no experiment results" in capsys.readouterr().err
    run("sqrt-dk", tmp_path, tiny=True)
    assert main(["experiment", "--index", "--output", str(tmp_path)]) == 0
    index = (tmp_path / "EXPERIMENTS.md").read_text()
    assert "## sqrt-dk: " in index and "![sqrt-dk](sqrt-dk.png)" in index and "senses" not in index
