"""Attention pages: the data they carry is the model's own (weights, queries, keys), decoders have an empty
upper triangle, the neuron view's arithmetic reproduces the weights, and the file is self-contained."""
from __future__ import annotations

import json
import re

import pytest
import torch

import attnlab
from attnlab.cli import main
from attnlab.viz.attention import AttentionData, extract, extract_text, neuron_softmax
from attnlab.viz.page import attention_page, render_page

TEXT, TEXT_B = "The cat sat on the mat.", "It was happy."


def page_data(page: str) -> dict:
    """The JSON the page script reads."""
    m = re.search(r"const DATA = (.*?);\nconst INITIAL", page, re.S)
    assert m, "data block not found in the page"
    return json.loads(m.group(1))


@pytest.fixture(scope="module")
def minilm_pair(minilm):
    model, tok = attnlab.load(minilm), attnlab.load_tokenizer(minilm)
    enc = tok(TEXT, TEXT_B, return_tensors="pt")
    return model, tok, enc


def tiny(**overrides) -> attnlab.Encoder:
    torch.manual_seed(0)
    cfg = attnlab.preset("bert-tiny", vocab_size=100, max_position_embeddings=64, **overrides)
    return attnlab.Encoder(cfg).eval()


def test_weights_are_the_models(minilm_pair):
    model, tok, enc = minilm_pair
    data = extract_text(model, tok, TEXT, TEXT_B, title="minilm")
    with torch.no_grad():
        ref = model(**enc, output_attentions=True).attentions
    assert data.tokens == enc.tokens(0) and data.tokens[0] == "[CLS]"
    assert data.segments == enc["token_type_ids"][0].tolist() and set(data.segments) == {0, 1}
    assert (data.num_layers, data.num_heads) == (6, 12)
    for ours, theirs in zip(data.layers, ref):
        # the page's forward has hooks (plain products), the reference runs oneDNN-packed ones: fp32 rounding
        torch.testing.assert_close(ours, theirs[0], rtol=0, atol=2e-6)
    page = page_data(render_page(data))
    for layer, ref_w in zip(page["layers"], ref):
        assert torch.allclose(torch.tensor(layer), ref_w[0], atol=5.1e-5)  # rounded to 4 decimals


def test_weights_match_transformers(minilm, minilm_pair):
    """The weights the page shows are BERT's: the same as transformers' eager attention."""
    transformers = pytest.importorskip("transformers")
    model, tok, enc = minilm_pair
    hf = transformers.BertModel.from_pretrained(str(minilm), attn_implementation="eager").eval()
    with torch.no_grad():
        theirs = hf(**enc, output_attentions=True).attentions
    data = extract_text(model, tok, TEXT, TEXT_B, neuron=False)
    for ours, ref in zip(data.layers, theirs):
        torch.testing.assert_close(ours, ref[0], rtol=1e-4, atol=1e-5)


def test_neuron_view_numbers_are_softmax_of_qk(minilm_pair):
    model, tok, _ = minilm_pair
    data = extract_text(model, tok, TEXT, TEXT_B)
    assert sorted(data.queries) == list(range(6))
    assert data.scale == pytest.approx(32 ** -0.5)
    for layer in range(data.num_layers):
        torch.testing.assert_close(neuron_softmax(data, layer), data.layers[layer], rtol=1e-4, atol=1e-6)
    # the page's rounded q and k still give the weights to 3 decimals (what the neuron view prints)
    page = page_data(render_page(data, view="neuron", layer=2, head=3))
    q, k = torch.tensor(page["queries"]["2"]), torch.tensor(page["keys"]["2"])
    soft = (q @ k.transpose(-1, -2) * page["scale"]).softmax(-1)
    assert torch.allclose(soft, data.layers[2], atol=2e-3)


@pytest.mark.parametrize("overrides", [
    dict(causal=True),
    dict(causal=True, position="rope", num_kv_heads=1, norm="rmsnorm", norm_placement="pre"),
    dict(position="relative_bias", attention_scale=1.0),
    dict(sliding_window=3, extra={"global_every": 2}),
    dict(position="none", disentangled_attention=["c2p", "p2c"], position_buckets=4, share_att_key=True,
         relative_embedding_norm=True),
], ids=["causal", "rope-gqa", "t5-bias", "local-global", "deberta"])
def test_neuron_view_all_variants(overrides):
    model = tiny(**overrides)
    ids = torch.randint(0, 100, (1, 9), generator=torch.Generator().manual_seed(1))
    data = extract(model, ids, [f"t{i}" for i in range(9)])
    for layer in range(data.num_layers):
        torch.testing.assert_close(neuron_softmax(data, layer), data.layers[layer], rtol=1e-4, atol=1e-6)
    if overrides.get("sliding_window"):
        assert 1 in data.allowed and 0 not in data.allowed  # layer 0 global, layer 1 local
        assert data.layers[1][:, 0, 5:].abs().max() == 0


def test_causal_upper_triangle_is_zero():
    model = tiny(causal=True)
    data = extract(model, torch.arange(1, 12)[None], [f"w{i}" for i in range(11)])
    assert data.causal
    for w in data.layers:
        assert torch.equal(w.triu(1), torch.zeros_like(w))
        assert torch.allclose(w.sum(-1), torch.ones(w.shape[:2]))
    page = render_page(data, view="model")
    got = page_data(page)
    assert got["causal"] is True
    assert all(x == 0 for layer in got["layers"] for head in layer for i, row in enumerate(head)
               for x in row[i + 1:])


def test_page_is_self_contained_and_escaped():
    data = AttentionData(tokens=["</script>", "<b>", "x"], layers=[torch.full((2, 3, 3), 1 / 3)], title="<t>")
    page = render_page(data)
    assert page.startswith("<!DOCTYPE html>") and page.count("</script>") == 1
    for needle in ("http://", "https://", "<link", "src=", "@import", "url("):
        assert needle not in page, needle
    assert "<title>&lt;t&gt;</title>" in page
    assert page_data(page)["tokens"] == ["</script>", "<b>", "x"]
    assert "__ATTNLAB" not in page


def test_cross_attention_data():
    torch.manual_seed(0)
    cross = [torch.rand(2, 3, 5).softmax(-1) for _ in range(2)]
    data = AttentionData(tokens=["<s>", "le", "chat"], layers=[torch.full((2, 3, 3), 1 / 3)] * 2, causal=True,
                         cross=cross, source_tokens=["the", "cat", "sat", "down", "</s>"])
    got = page_data(render_page(data))
    assert got["sourceTokens"][1] == "cat" and len(got["cross"]) == 2
    assert torch.allclose(torch.tensor(got["cross"][1]), cross[1], atol=5.1e-5)
    with pytest.raises(ValueError, match=r"cross\[0\] has shape \(2, 3, 5\); expected \(heads, 3, 4\)"):
        AttentionData(tokens=["a", "b", "c"], layers=[torch.full((2, 3, 3), 1 / 3)], cross=cross,
                      source_tokens=["w", "x", "y", "z"])


def test_bad_inputs_say_what_is_wrong():
    data = AttentionData(tokens=["a", "b"], layers=[torch.full((1, 2, 2), 0.5)])
    with pytest.raises(ValueError, match="view must be one of"):
        render_page(data, view="graph")
    with pytest.raises(ValueError, match="layer 3 does not exist"):
        render_page(data, layer=3)
    with pytest.raises(ValueError, match=r"layers\[0\] has shape \(1, 2, 2\); expected \(1, 3, 3\)"):
        AttentionData(tokens=["a", "b", "c"], layers=[torch.full((1, 2, 2), 0.5)])


def test_attention_page_for_a_server(minilm_pair):
    model, tok, _ = minilm_pair
    page = attention_page(model, tok, "attention is all you need", view="neuron", layer=5, head=0, title="minilm")
    got = page_data(page)
    assert got["tokens"] == ["[CLS]", "attention", "is", "all", "you", "need", "[SEP]"]
    assert got["title"] == "minilm" and '"view":"neuron"' in page


def test_cli_writes_page_and_pngs(minilm, tmp_path, capsys):
    out = tmp_path / "pair.html"
    assert main(["viz", str(minilm), "--text", TEXT, "--text-b", TEXT_B, "--output", str(out),
                 "--view", "model", "--layer", "1", "--head", "2", "--png"]) == 0
    page = out.read_text()
    assert '"view":"model"' in page and '"layer":1' in page and "[SEP]" in page
    for png in (tmp_path / "pair.png", tmp_path / "pair-L1H2.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "wrote" in capsys.readouterr().out
    assert main(["viz", str(minilm), "--text", TEXT, "--output", str(out), "--layer", "9"]) == 1
    assert "layer 9 does not exist" in capsys.readouterr().err
    assert main(["viz", str(minilm), "--text", " ", "--output", str(out)]) == 1
    assert "--text is empty" in capsys.readouterr().err


def test_cli_page_for_an_encoder_decoder(tmp_path, minilm):
    """`attnlab viz` on a seq2seq model directory shows decoder self- and cross-attention, for a given
    target (--text-b) or for the model's own greedy output."""
    from attnlab.config import preset
    from attnlab.models.seq2seq import Seq2SeqLM
    from attnlab.interop.native import save_model
    torch.manual_seed(0)
    model = Seq2SeqLM(preset("transformer-base", vocab_size=30522, hidden_size=32, num_layers=2, num_heads=2,
                             intermediate_size=64, pad_token_id=0)).eval()
    save_model(model, tmp_path / "mt")
    attnlab.load_tokenizer(minilm).save(tmp_path / "mt")
    for extra in ([], ["--text-b", "ein mann"]):
        out = tmp_path / f"page{len(extra)}.html"
        assert main(["viz", str(tmp_path / "mt"), "--text", "a man rides a bike", *extra, "--output", str(out)]) == 0
        page = out.read_text()
        assert '"cross"' in page and "rides" in page
