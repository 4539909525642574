// attnlab explore: the attention views (tokens, model view, head view, the equation with real numbers).
// Plain JS, no framework. Model and user text only ever reach the page through textContent,
// never innerHTML. Attention is fetched one layer/head at a time, so a long input stays small.
"use strict";

const explore = (() => {
  const $ = (id) => document.getElementById(id);
  const state = {
    model: null, run: null, tokens: [], global: [], layer: 0, head: 0, token: 0, view: "model",
    gen: 0,          // bumped per edit: answers of an older edit are dropped
    attention: null, // the open head's map (one layer/head only)
    thumbs: null,    // {size, maps: Uint8Array per layer*head, each scaled to its own peak}
    timing: null,    // the last edit: {start, end, serverMs}, read by the latency benchmark
    renders: 0,
  };
  const hooks = { afterRun: [], views: {}, init: [] };  // explore-tasks.js registers the task views here

  // The api key comes from the URL fragment (#key=...), which browsers never send to the server.
  const key = new URLSearchParams(location.hash.slice(1)).get("key");

  async function api(path, body) {
    const headers = {};
    if (key) headers.Authorization = "Bearer " + key;
    const init = { headers };
    if (body !== undefined) {
      init.method = "POST";
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const r = await fetch(path, init);
    let data = null;
    try { data = await r.json(); } catch (e) { data = null; }
    if (!r.ok) {
      const e = data && data.error;  // {"error": "..."}, or serve's {"error": {"message": ...}} (host check)
      const msg = !e ? `${r.status} ${r.statusText}` : typeof e === "string" ? e : e.message || JSON.stringify(e);
      throw new Error(msg);
    }
    return data;
  }

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // 4 significant digits on screen; the full value stays in data-value for whoever reads it back.
  function fmt(x) {
    if (x === null || x === undefined) return "";
    if (!isFinite(x)) return x > 0 ? "∞" : "−∞";
    if (x === 0) return "0";
    const a = Math.abs(x);
    return a >= 1e4 || a < 1e-3 ? x.toExponential(2) : Number(x.toPrecision(4)).toString();
  }

  // Whitespace made visible, so " the" and "the" look different.
  function showPiece(p) {
    return p.replace(/ /g, "␣").replace(/\n/g, "↵").replace(/\t/g, "⇥") || "∅";
  }

  function setError(msg) {
    const e = $("error");
    e.hidden = !msg;
    e.textContent = msg || "";
  }

  function fillSelect(sel, n, label, value) {
    sel.replaceChildren();
    for (let i = 0; i < n; i++) {
      const o = el("option", null, label ? label(i) : String(i));
      o.value = String(i);
      sel.append(o);
    }
    sel.value = String(Math.min(value, Math.max(n - 1, 0)));
  }

  // White -> blue; `v` in [0, 1].
  function shade(v) {
    const t = Math.max(0, Math.min(1, v));
    return [Math.round(255 - 225 * t), Math.round(255 - 165 * t), Math.round(255 - 45 * t)];
  }

  // ------------------------------------------------------------------------------------------ model
  async function loadModel() {
    const m = await api("/api/model");
    state.model = m;
    $("model-name").textContent = m.name;
    const parts = [m.kind, m.family, m.architecture, `${m.num_layers} layers × ${m.num_heads} heads`,
      m.num_kv_heads !== m.num_heads ? `${m.num_kv_heads} KV heads` : null, `d_model ${m.hidden_size}`,
      `head dim ${m.head_dim}`, `vocab ${m.vocab_size}`, `attention: ${m.attention_kind}`,
      `max ${m.max_tokens} tokens`, m.quantized ? `weights ${m.quantized}` : null];
    $("model-summary").textContent = parts.filter(Boolean).join(" · ");
    const ul = $("explain");
    ul.replaceChildren();
    for (const x of m.explain || []) {
      const li = el("li");
      li.dataset.id = x.id;
      li.dataset.value = x.value;
      li.tabIndex = 0;
      li.title = x.formula + (x.detail ? "\n" + x.detail : "");
      li.append(el("span", "label", x.label + ": "), el("b", null, x.pretty),
        el("span", "formula", x.formula + (x.detail ? " — " + x.detail : "")));
      ul.append(li);
    }
    fillSelect($("layer"), m.num_layers, null, 0);
    fillSelect($("head"), m.num_heads, null, 0);
    $("text-b-row").hidden = m.kind !== "encoder";
    if (m.kind === "encoder-decoder") $("text-label").textContent = "Source text";
    const f = m.features || {};
    const shown = { next: f.next_token, fill: f.fill_mask, similarity: f.similarity, cross: f.cross_attention };
    for (const [v, on] of Object.entries(shown)) document.querySelector(`[data-view=${v}]`).hidden = !on;
    const defaults = { encoder: "The cat sat on the mat because it was tired.",
      decoder: "The capital of France is", "encoder-decoder": "translate English to German: The house is small." };
    const fromHash = new URLSearchParams(location.hash.slice(1)).get("text");
    $("text").value = fromHash !== null ? fromHash : (defaults[m.kind] || "Hello world.");
  }

  // ------------------------------------------------------------------------------------------ run
  // An edit runs at once when nothing is in flight; edits made meanwhile collapse into one run when it
  // returns. Typing fast keeps one request in flight, and a single edit waits for no timer.
  let inflight = false, pending = null;
  function onEdit(ev) {
    const start = ev && ev.timeStamp !== undefined ? ev.timeStamp : performance.now();
    if (inflight) { pending = start; return; }
    update(start);
  }

  async function update(start) {
    inflight = true;
    try {
      await runText(start);
    } finally {
      inflight = false;
      if (pending !== null) { const s = pending; pending = null; update(s); }
    }
  }

  async function runText(start) {
    const gen = ++state.gen;
    document.body.dataset.busy = "1";
    // a decoder's last token is the one that predicts the next: open on it the first time
    const first = state.renders === 0 && state.model.kind === "decoder";
    const body = { text: $("text").value, text_b: null, layer: state.layer, head: state.head,
                   token: first ? 1 << 30 : state.token };  // the server clamps the token to the last one
    if (state.model.kind === "encoder" && $("text-b").value.trim()) body.text_b = $("text-b").value;
    let r;
    try {
      r = await api("/api/run", body);
    } catch (e) {
      if (gen === state.gen) { setError("run: " + e.message); document.body.dataset.busy = "0"; }
      return;
    }
    if (gen !== state.gen) return;
    setError("");
    state.run = r.run;
    state.tokens = r.tokens;
    state.global = r.global_tokens || [];
    state.token = r.view ? r.view.head.token : Math.min(state.token, r.tokens.length - 1);
    const n = r.tokens.length, size = r.thumbnails.size;
    // one byte per cell, each map scaled to its own peak: drawn as they are (drawMap normalizes)
    const bytes = Uint8Array.from(atob(r.thumbnails.data), (c) => c.charCodeAt(0));
    const maps = [];
    for (let i = 0; i < r.num_layers * r.num_heads; i++) maps.push(bytes.subarray(i * size * size, (i + 1) * size * size));
    state.thumbs = { size, maps };
    $("mask-kind").textContent = "mask: " + r.mask_kind;
    $("status").textContent = `${n} tokens · server ${fmt(r.ms)} ms`;
    renderTokens();
    fillSelect($("token"), n, (i) => `${i}: ${showPiece(r.tokens[i].piece)}`, state.token);
    renderGrid(r.num_layers, r.num_heads);
    const jobs = [];
    if (r.view) {
      state.attention = r.view.attention;
      renderHead(r.view.attention);
      renderEquation(r.view.head);
    } else {
      jobs.push(loadHead(gen));
    }
    for (const f of hooks.afterRun) jobs.push(f(gen, body.text));
    await Promise.all(jobs);
    if (gen !== state.gen) return;
    state.timing = { start, end: performance.now(), serverMs: r.ms, tokens: n };
    state.renders++;
    document.body.dataset.busy = "0";
    document.body.dataset.renders = String(state.renders);
    document.body.dataset.ready = "1";
  }

  function renderTokens() {
    const box = $("tokens");
    box.replaceChildren();
    state.tokens.forEach((t, i) => {
      const global = state.global.includes(i);  // Longformer: sees and is seen by every token
      const b = el("button", "tok" + (t.special ? " special" : "") + (t.segment ? " seg1" : "") + (global ? " global" : ""));
      b.type = "button";
      b.dataset.i = i;
      b.dataset.id = t.id;
      b.dataset.piece = t.piece;
      b.append(el("span", "piece", showPiece(t.piece)), el("span", "id", String(t.id)));
      b.title = `position ${i}, id ${t.id}` + (global ? ", global attention" : "");
      b.addEventListener("click", () => selectToken(i));
      box.append(b);
    });
    markToken();
  }

  function markToken() {
    for (const b of $("tokens").children) b.classList.toggle("sel", Number(b.dataset.i) === state.token);
  }

  function selectToken(i) {
    state.token = i;
    $("token").value = String(i);
    markToken();
    loadHead(state.gen, true);
  }

  // ------------------------------------------------------------------------------------------ model view
  function renderGrid(layers, heads) {
    const grid = $("grid");
    const { size, maps } = state.thumbs;
    if (grid.dataset.shape === `${layers}x${heads}`) {  // an edit: redraw the canvases already there
      for (let l = 0; l < layers; l++) {
        for (let h = 0; h < heads; h++) drawMap($(`thumb-${l}-${h}`).firstChild, maps[l * heads + h], size, size, null, true);
      }
      markThumb();
      return;
    }
    grid.dataset.shape = `${layers}x${heads}`;
    grid.replaceChildren();
    grid.style.gridTemplateColumns = `auto repeat(${heads}, 1fr)`;
    grid.append(el("span", "corner", "L\\H"));
    for (let h = 0; h < heads; h++) grid.append(el("span", "colhead", String(h)));
    for (let l = 0; l < layers; l++) {
      grid.append(el("span", "rowhead", String(l)));
      for (let h = 0; h < heads; h++) {
        const b = el("button", "thumb");
        b.type = "button";
        b.id = `thumb-${l}-${h}`;
        b.dataset.layer = l;
        b.dataset.head = h;
        b.setAttribute("aria-label", `layer ${l} head ${h}`);
        const c = el("canvas");
        c.width = c.height = size;
        drawMap(c, maps[l * heads + h], size, size, null, true);
        b.append(c);
        b.addEventListener("click", () => openHead(l, h));
        grid.append(b);
      }
    }
    markThumb();
  }

  function markThumb() {
    for (const b of $("grid").querySelectorAll(".thumb.sel")) b.classList.remove("sel");
    const t = $(`thumb-${state.layer}-${state.head}`);
    if (t) t.classList.add("sel");
  }

  function openHead(l, h) {
    state.layer = l;
    state.head = h;
    $("layer").value = String(l);
    $("head").value = String(h);
    markThumb();
    showView("head");
    loadHead(state.gen, false);
  }

  // weights: rows*cols floats. Thumbnails scale to their own maximum; the head map uses √weight.
  function drawMap(canvas, w, rows, cols, allowed, normalize) {
    canvas.width = cols;
    canvas.height = rows;
    const ctx = canvas.getContext("2d");
    const img = ctx.createImageData(cols, rows);
    let max = 1;
    if (normalize) { max = 0; for (let i = 0; i < w.length; i++) if (w[i] > max) max = w[i]; max = max || 1; }
    for (let i = 0; i < rows * cols; i++) {
      let rgb;
      if (allowed && !allowed[i]) rgb = [225, 225, 225];
      else rgb = shade(normalize ? w[i] / max : Math.sqrt(w[i]));
      img.data.set([rgb[0], rgb[1], rgb[2], 255], i * 4);
    }
    ctx.putImageData(img, 0, 0);
  }

  // ------------------------------------------------------------------------------------------ head view
  // Fetches the open head's map and the equation of the query token; `rowOnly` skips the map refetch.
  async function loadHead(gen, rowOnly) {
    const q = `run=${encodeURIComponent(state.run)}&layer=${state.layer}&head=${state.head}`;
    const { layer, head, token } = state;
    try {
      const [att, eq] = await Promise.all([
        rowOnly && state.attention ? Promise.resolve(state.attention) : api("/api/attention?" + q),
        api(`/api/head?${q}&token=${token}`),
      ]);
      if (gen !== state.gen || layer !== state.layer || head !== state.head || token !== state.token) return;
      state.attention = att;
      renderHead(att);
      renderEquation(eq);
    } catch (e) {
      if (gen === state.gen) setError("head: " + e.message);
    }
  }

  function renderHead(att) {
    const n = att.n;
    $("head-title").textContent = `layer ${att.layer}, head ${att.head}`;
    $("mask-note").textContent = att.mask_note;
    const c = $("heatmap");
    drawMap(c, att.weights, n, n, att.allowed, false);
    const px = Math.max(1, Math.floor(Math.min(520, 24 * n) / n));  // whole pixels per cell, ≤ 520 px
    c.style.width = c.style.height = px * n + "px";
    c.dataset.n = n;
    axis($("heat-left"), n, px, "height");
    axis($("heat-top"), n, px, "width");
    renderRow(att);
  }

  // Token labels along the map, only where a cell is tall enough to read one.
  function axis(box, n, px, side) {
    box.replaceChildren();
    if (px < 11) return;
    for (let i = 0; i < n; i++) {
      const s = el("span", null, showPiece(state.tokens[i] ? state.tokens[i].piece : String(i)));
      s.style[side] = px + "px";
      s.style.fontSize = Math.min(12, px - 2) + "px";
      box.append(s);
    }
  }

  function renderRow(att) {
    const n = att.n, i = state.token, box = $("head-row");
    for (const s of $("heat-left").children) s.classList.toggle("sel", s === $("heat-left").children[i]);
    $("row-token").textContent = `${i} (${showPiece(state.tokens[i] ? state.tokens[i].piece : "")})`;
    box.replaceChildren();
    for (let j = 0; j < n; j++) {
      const w = att.weights[i * n + j];
      const s = el("span", "tok-w", showPiece(state.tokens[j] ? state.tokens[j].piece : String(j)));
      s.dataset.j = j;
      s.dataset.value = w;
      const rgb = shade(Math.sqrt(w));
      s.style.background = `rgb(${rgb})`;
      if (w > 0.35) s.style.color = "#fff";
      if (att.allowed && !att.allowed[i * n + j]) s.classList.add("masked");
      s.title = `key ${j}: weight ${fmt(w)}`;
      box.append(s);
    }
  }

  // ------------------------------------------------------------------------------------------ equation
  function vector(box, values) {
    box.replaceChildren();
    values.forEach((v, i) => {
      const s = el("span", "num", fmt(v));
      s.dataset.i = i;
      s.dataset.value = v;
      box.append(s);
    });
  }

  function strip(values, max) {
    const c = el("canvas", "strip");
    c.width = values.length;
    c.height = 1;
    const ctx = c.getContext("2d"), img = ctx.createImageData(values.length, 1);
    values.forEach((v, i) => {  // blue positive, red negative
      const t = Math.min(1, Math.abs(v) / max);
      const rgb = v >= 0 ? shade(t) : [Math.round(255 - 30 * t), Math.round(255 - 200 * t), Math.round(255 - 200 * t)];
      img.data.set([rgb[0], rgb[1], rgb[2], 255], i * 4);
    });
    ctx.putImageData(img, 0, 0);
    c.title = values.map(fmt).join(", ");
    return c;
  }

  function renderEquation(eq) {
    const i = eq.token, dk = eq.d_k, sqrt = Math.sqrt(dk);
    const isDefault = Math.abs(eq.scale * sqrt - 1) < 1e-4;
    const scaleText = isDefault ? `1/√d_k = 1/√${dk} = ${fmt(eq.scale)}` : `scale = ${fmt(eq.scale)} (set by the config)`;
    const f = $("eq-formula");
    f.replaceChildren();
    const sc = el("span", null, scaleText);
    sc.id = "scale";
    sc.dataset.value = eq.scale;
    f.append(el("span", null, `output of token ${i} = softmax(q·Kᵀ × s${eq.bias ? " + bias" : ""}, masked) · V,  s = `),
      sc, el("span", null, `;  d_k = ${dk}`));
    $("q-index").textContent = String(i);
    $("scale-head").textContent = fmt(eq.scale);
    $("bias-head").hidden = !eq.bias;
    vector($("q"), eq.q);
    vector($("out"), eq.output);
    let kmax = 1e-9, vmax = 1e-9, wmax = 1e-9;
    for (const row of eq.k) for (const x of row) kmax = Math.max(kmax, Math.abs(x));
    for (const row of eq.v) for (const x of row) vmax = Math.max(vmax, Math.abs(x));
    for (const w of eq.weights) wmax = Math.max(wmax, w);
    const body = $("eq-table").tBodies[0];
    const rows = [];
    for (let j = 0; j < eq.raw.length; j++) {
      const tr = el("tr");
      tr.dataset.j = j;
      if (!eq.allowed[j]) tr.className = "masked";
      const cell = (cls, attr, v, text) => {
        const td = el("td", cls, text !== undefined ? text : fmt(v));
        if (attr) { td.dataset[attr] = j; td.dataset.value = v; }
        return td;
      };
      const tok = state.tokens[j];
      const kc = el("td"), vc = el("td");
      kc.append(strip(eq.k[j], kmax));
      vc.append(strip(eq.v[j], vmax));
      const wc = cell("weight", "weight", eq.weights[j]);
      const bar = el("span", "bar");
      bar.style.width = Math.round(60 * eq.weights[j] / wmax) + "px";
      wc.prepend(bar);
      tr.append(cell("j", null, null, String(j)), cell("piece", null, null, tok ? showPiece(tok.piece) : ""), kc,
        cell("raw", "raw", eq.raw[j]), cell("scaled", "scaled", eq.scaled[j]));
      if (eq.bias) tr.append(cell("bias", "bias", eq.bias[j]));
      tr.append(cell("allowed", "allowed", eq.allowed[j], eq.allowed[j] ? "✓" : "−∞"), wc, vc);
      rows.push(tr);
    }
    body.replaceChildren(...rows);
  }

  // ------------------------------------------------------------------------------------------ views
  function showView(v) {
    state.view = v;
    for (const b of document.querySelectorAll("#tabs button")) b.setAttribute("aria-selected", String(b.dataset.view === v));
    for (const s of document.querySelectorAll("section.view")) s.hidden = s.id !== "view-" + v;
    $("controls").hidden = !["model", "head", "equation"].includes(v);
    if (hooks.views[v]) hooks.views[v]();
  }

  function wire() {
    $("text").addEventListener("input", onEdit);
    $("text-b").addEventListener("input", onEdit);
    $("layer").addEventListener("change", () => { state.layer = Number($("layer").value); markThumb(); loadHead(state.gen); });
    $("head").addEventListener("change", () => { state.head = Number($("head").value); markThumb(); loadHead(state.gen); });
    $("token").addEventListener("change", () => selectToken(Number($("token").value)));
    for (const b of document.querySelectorAll("#tabs button")) b.addEventListener("click", () => showView(b.dataset.view));
    $("heatmap").addEventListener("click", (ev) => {  // a click on a row picks that query token
      const c = ev.currentTarget, n = Number(c.dataset.n || 0);
      if (!n) return;
      const i = Math.floor((ev.offsetY / c.getBoundingClientRect().height) * n);
      selectToken(Math.max(0, Math.min(n - 1, i)));
    });
  }

  async function start() {
    wire();
    try {
      await loadModel();
    } catch (e) {
      setError("model: " + e.message);
      return;
    }
    for (const f of hooks.init) f();
    showView("model");
    await update(performance.now());
  }

  document.addEventListener("DOMContentLoaded", () => setTimeout(start, 0));  // tasks file registers first
  return { state, hooks, api, el, fmt, showPiece, setError, drawMap, shade, fillSelect, showView, update, $ };
})();
