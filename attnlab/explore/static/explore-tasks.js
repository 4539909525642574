// attnlab explore: the task views. Decoders: next-token distribution, sampling sliders, stepping with the KV
// cache, greedy vs sampled paths. Encoders: fill-mask, similarity. Encoder-decoders: cross-attention.
"use strict";

(() => {
  const { state, hooks, api, el, fmt, showPiece, setError, drawMap, shade, fillSelect, $ } = explore;

  // ---------------------------------------------------------------------------------------- next token
  const dec = { session: null, greedy: null, kvHistory: [], reshaping: false, again: false, steps: Promise.resolve() };

  // Answers can arrive out of order (a slow request overtaken by a newer one): each view draws only the
  // answer to its latest request. `ask(view)` numbers a request; the returned check says it is still the latest.
  const asked = {};
  function ask(view) {
    const n = asked[view] = (asked[view] || 0) + 1;
    return () => asked[view] === n;
  }

  function shape() {
    return { temperature: Number($("temperature").value), top_k: Number($("top-k").value),
      top_p: Number($("top-p").value) };
  }

  function sliderLabels() {
    $("temperature-out").textContent = $("temperature").value;
    $("top-k-out").textContent = $("top-k").value === "0" ? "off" : $("top-k").value;
    $("top-p-out").textContent = $("top-p").value;
  }

  function renderTop(top) {
    const ol = $("next-top"), rows = [];
    const pmax = Math.max(1e-9, ...top.map((t) => Math.max(t.prob, t.shaped_prob)));
    for (const t of top) {
      const li = el("li");
      li.dataset.id = t.id;
      li.dataset.prob = t.prob;
      li.dataset.shaped = t.shaped_prob;
      li.dataset.logit = t.logit;
      const b = el("button", "cand");
      b.type = "button";
      b.title = `id ${t.id} · logit ${fmt(t.logit)} · append this token`;
      const bars = el("span", "bars");
      const p = el("span", "bar p"), s = el("span", "bar s");
      p.style.width = Math.round(160 * t.prob / pmax) + "px";
      s.style.width = Math.round(160 * t.shaped_prob / pmax) + "px";
      bars.append(p, s);
      b.append(el("span", "piece", showPiece(t.piece)), bars,
        el("span", "num", `${fmt(100 * t.prob)}% → ${fmt(100 * t.shaped_prob)}%`));
      if (t.shaped_prob === 0) li.classList.add("cut");
      b.addEventListener("click", () => step(t.id));
      li.append(b);
      rows.push(li);
    }
    ol.replaceChildren(...rows);
  }

  function renderNext(r) {
    dec.session = r.session;
    dec.greedy = r.greedy;
    const g = $("greedy");
    g.textContent = showPiece(r.greedy.piece);
    g.dataset.id = r.greedy.id;
    renderTop(r.top);
    const kv = r.kv_cache, total = $("kv-total");
    total.textContent = `${kv.tokens} tokens · ${(kv.bytes / 1024).toFixed(1)} KiB`;
    total.dataset.tokens = kv.tokens;
    total.dataset.bytes = kv.bytes;
    dec.kvHistory.push(kv.bytes);
    const max = Math.max(1, ...kv.bytes_per_layer);
    const box = $("kv-layers"), rows = [];
    kv.bytes_per_layer.forEach((bytes, l) => {
      const row = el("div", "kv");
      row.dataset.layer = l;
      row.dataset.bytes = bytes;
      const bar = el("span", "bar");
      bar.style.width = Math.round(140 * bytes / max) + "px";
      row.append(el("span", "lbl", `L${l}`), bar, el("span", "num", `${(bytes / 1024).toFixed(1)} KiB`));
      rows.push(row);
    });
    const hist = el("p", "kv-history", "total per step: " + dec.kvHistory.map((b) => (b / 1024).toFixed(1)).join(" → ") + " KiB");
    box.replaceChildren(hist, ...rows);
  }

  async function loadNext(gen, text) {
    dec.kvHistory = [];
    $("continuation").replaceChildren();
    try {
      const r = await api("/api/next", { text, ...shape(), top: 20 });
      if (gen !== state.gen) return;
      renderNext(r);
    } catch (e) {
      if (gen === state.gen) setError("next: " + e.message);
    }
  }

  // The sliders re-shape the kept logits (no model call); one request in flight, the latest value wins.
  async function reshape() {
    sliderLabels();
    if (!dec.session) return;
    if (dec.reshaping) { dec.again = true; return; }
    dec.reshaping = true;
    try {
      const r = await api("/api/reshape", { session: dec.session, ...shape(), top: 20 });
      renderTop(r.top);
      document.body.dataset.reshaped = String(Number(document.body.dataset.reshaped || 0) + 1);
    } catch (e) {
      setError("reshape: " + e.message);
    } finally {
      dec.reshaping = false;
      if (dec.again) { dec.again = false; reshape(); }
    }
  }

  // Steps grow one KV cache in order: a click while a step is in flight waits for it.
  function step(token) {
    dec.steps = dec.steps.then(() => stepNow(token));
    return dec.steps;
  }

  async function stepNow(token) {
    const session = dec.session;
    if (!session) return;
    if (token === "greedy") {  // the greedy token when the step runs (an earlier queued step moves it)
      if (!dec.greedy) return;
      token = dec.greedy.id;
    }
    const seed = Number($("seed").value) || 0, start = performance.now();
    try {
      const r = await api("/api/step", { session, token, ...shape(), seed });
      if (session !== dec.session) return;  // the text changed meanwhile: this step's prompt is gone
      renderNext(r);
      state.stepTiming = { start, end: performance.now(), serverMs: r.ms };  // read by the latency benchmark
      const s = el("span", "appended", showPiece(r.appended.piece));
      s.dataset.id = r.appended.id;
      $("continuation").append(s);
      if (token === null) $("seed").value = String(seed + 1);  // the next sample draws differently
      document.body.dataset.steps = String($("continuation").children.length);
    } catch (e) {
      if (session === dec.session) setError("step: " + e.message);
    }
  }

  async function paths() {
    const steps = Math.max(1, Math.min(64, Number($("paths-steps").value) || 12)), latest = ask("paths");
    try {
      const r = await api("/api/paths", { text: $("text").value, steps, ...shape(), seed: Number($("seed").value) || 0 });
      if (!latest()) return;
      for (const [id, list] of [["paths-greedy", r.greedy], ["paths-sampled", r.sampled]]) {
        $(id).replaceChildren(...list.map((t) => {
          const li = el("li", null, showPiece(t.piece));
          li.dataset.id = t.id;
          li.dataset.prob = t.prob;
          li.title = `id ${t.id} · p ${fmt(t.prob)}`;
          li.append(el("small", null, " " + fmt(t.prob)));
          return li;
        }));
      }
      document.body.dataset.paths = "1";
    } catch (e) {
      if (latest()) setError("paths: " + e.message);
    }
  }

  // ---------------------------------------------------------------------------------------- encoders
  async function fill() {
    const latest = ask("fill");
    try {
      const r = await api("/api/fill_mask", { text: $("fill-text").value, top: 10 });
      if (!latest()) return;
      setError("");
      $("fill-results").replaceChildren(...r.masks.map((m) => {
        const div = el("div", "mask");
        div.dataset.position = m.position;
        div.append(el("h4", null, `position ${m.position}`));
        const ol = el("ol");
        for (const t of m.top) {
          const li = el("li");
          li.dataset.id = t.id;
          li.dataset.prob = t.prob;
          const bar = el("span", "bar");
          bar.style.width = Math.round(160 * t.prob) + "px";
          li.append(el("span", "piece", showPiece(t.piece)), bar, el("span", "num", fmt(100 * t.prob) + "%"));
          ol.append(li);
        }
        div.append(ol);
        return div;
      }));
    } catch (e) {
      if (latest()) setError("fill mask: " + e.message);
    }
  }

  async function similarity() {
    const latest = ask("similarity");
    try {
      const r = await api("/api/similarity", { a: $("sim-a").value, b: $("sim-b").value });
      if (!latest()) return;
      setError("");
      const c = $("sim-cosine");
      c.textContent = r.cosine.toFixed(4);
      c.dataset.value = r.cosine;
      $("sim-info").textContent = `(${r.pooling} pooling, ${r.dim} dimensions)`;
    } catch (e) {
      if (latest()) setError("similarity: " + e.message);
    }
  }

  // ---------------------------------------------------------------------------------------- cross-attention
  const cross = { run: null, source: [], target: [], t: 0, weights: null };

  async function translate() {
    const body = { text: $("text").value, max_new_tokens: Math.max(1, Math.min(64, Number($("max-new").value) || 20)),
      target: $("target").value.trim() ? $("target").value : null };
    const latest = ask("translate");
    try {
      const r = await api("/api/translate", body);
      if (!latest()) return;
      setError("");
      cross.run = r.run;
      cross.source = r.source;
      cross.target = r.target;
      cross.t = 0;
      fillSelect($("cross-layer"), r.num_layers, null, Number($("cross-layer").value) || 0);
      fillSelect($("cross-head"), r.num_heads, null, Number($("cross-head").value) || 0);
      const box = $("target-tokens");
      box.replaceChildren(...r.target.map((t, i) => {
        const b = el("button", "tok");
        b.type = "button";
        b.dataset.t = i;
        b.dataset.id = t.id;
        b.append(el("span", "piece", showPiece(t.piece)), el("span", "id", String(t.id)));
        b.addEventListener("click", () => { cross.t = i; renderCrossRow(); });
        return b;
      }));
      await loadCross();
    } catch (e) {
      if (latest()) setError("translate: " + e.message);
    }
  }


  async function loadCross() {
    if (!cross.run) return;
    const layer = $("cross-layer").value, head = $("cross-head").value, latest = ask("cross");
    try {
      const r = await api(`/api/cross?run=${encodeURIComponent(cross.run)}&layer=${layer}&head=${head}`);
      if (!latest()) return;
      cross.weights = r;
      const c = $("cross-map");
      drawMap(c, r.weights, r.t, r.s, null, false);
      const px = Math.max(1, Math.floor(Math.min(520, 24 * Math.max(r.t, r.s)) / Math.max(r.t, r.s)));
      c.style.width = px * r.s + "px";
      c.style.height = px * r.t + "px";
      renderCrossRow();
      document.body.dataset.cross = `${layer}-${head}`;
    } catch (e) {
      if (latest()) setError("cross-attention: " + e.message);
    }
  }

  function renderCrossRow() {
    const r = cross.weights;
    if (!r) return;
    const i = Math.min(cross.t, r.t - 1);
    for (const b of $("target-tokens").children) b.classList.toggle("sel", Number(b.dataset.t) === i);
    $("cross-token").textContent = `${i} (${showPiece(cross.target[i] ? cross.target[i].piece : "")})`;
    const row = [];
    for (let j = 0; j < r.s; j++) {
      const w = r.weights[i * r.s + j];
      const s = el("span", "tok-w", showPiece(cross.source[j] ? cross.source[j].piece : String(j)));
      s.dataset.cross = j;
      s.dataset.value = w;
      s.style.background = `rgb(${shade(Math.sqrt(w))})`;
      if (w > 0.35) s.style.color = "#fff";
      row.push(s);
    }
    $("cross-row").replaceChildren(...row);
  }

  // ---------------------------------------------------------------------------------------- wiring
  hooks.init.push(() => {
    const m = state.model, f = m.features || {};
    if (f.next_token) hooks.afterRun.push(loadNext);
    if (f.fill_mask) {
      const mask = m.mask_token || "[MASK]";
      $("mask-token").textContent = mask;
      $("fill-text").value = `The cat sat on the ${mask}.`;
    }
  });
  for (const id of ["temperature", "top-k", "top-p"]) $(id).addEventListener("input", reshape);
  $("step-sample").addEventListener("click", () => step(null));
  $("step-greedy").addEventListener("click", () => step("greedy"));
  $("paths-run").addEventListener("click", paths);
  $("fill-run").addEventListener("click", fill);
  $("fill-text").addEventListener("keydown", (e) => { if (e.key === "Enter") fill(); });
  $("sim-run").addEventListener("click", similarity);
  $("translate-run").addEventListener("click", translate);
  $("cross-layer").addEventListener("change", loadCross);
  $("cross-head").addEventListener("change", loadCross);
  $("cross-map").addEventListener("click", (ev) => {
    const r = cross.weights;
    if (!r) return;
    cross.t = Math.max(0, Math.min(r.t - 1, Math.floor(ev.offsetY / ev.currentTarget.getBoundingClientRect().height * r.t)));
    renderCrossRow();
  });
})();
