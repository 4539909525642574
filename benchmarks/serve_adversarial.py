"""Does one hostile client stall the others? 64 ordinary clients (streaming and plain completions, embeddings)
against `attnlab serve`, first alone, then alongside adversaries sending what used to stall the server:
stop strings the schema must refuse (900,000 characters), stop lists at the limit (4 x 256 characters),
/viz pages over the cap and one within it, streams read slowly, completions abandoned before their
answer. Meanwhile /health is probed every 100 ms.

Reported per phase: inter-token latency (the gaps between a stream's chunks, as its client sees them)
p50/p99, /health's slowest answer, requests done, and failures (an ordinary request that did not get its
200, an adversary that did not get the answer it should: 422 / 413 / 200).

The server runs in its own process (`python -m attnlab serve`), so the clients' work does not share its
interpreter. MODEL: a packaged name or a directory; by default a tiny random decoder (2 layers) with
SmolLM2's tokenizer, saved to a temporary directory, which keeps decoding cheap so the table shows what
the server adds.

usage: .venv/bin/python benchmarks/serve_adversarial.py [--model smollm2] [--requests 512] [--max-tokens 16]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
CLIENTS = 64
PROMPTS = [f"Client story {i}:" + " once" * (i % 5) for i in range(12)]
PAUSE = 0.25  # seconds between one adversary's requests
AT_LIMIT = ["\u00e9" * 255 + str(i) for i in range(4)]  # 4 stop strings of 256 characters: accepted


@dataclass
class Phase:
    gaps: list[float] = field(default_factory=list)       # seconds between a stream's chunks
    health: list[float] = field(default_factory=list)     # seconds per /health answer
    done: int = 0
    failures: list[str] = field(default_factory=list)
    adversarial: dict = field(default_factory=dict)       # kind -> count sent

    def summary(self) -> dict:
        gaps = sorted(self.gaps)
        q = lambda p: gaps[min(len(gaps) - 1, int(p / 100 * (len(gaps) - 1)))] if gaps else float("nan")  # noqa: E731
        return {"p50_ms": 1000 * q(50), "p99_ms": 1000 * q(99), "health_max_ms": 1000 * max(self.health, default=0),
                "health_probes": len(self.health), "requests": self.done, "failures": len(self.failures),
                "gaps": len(gaps), "adversarial": dict(self.adversarial)}


async def ordinary(client: httpx.AsyncClient, i: int, max_tokens: int, phase: Phase, expected: dict | None) -> None:
    """Request i of the ordinary load: stream, plain completion, embeddings, stream (in turn)."""
    kind = ("stream", "complete", "embed", "stream")[i % 4]
    prompt, n = PROMPTS[(i * 7) % len(PROMPTS)], max_tokens - i % 3
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0}
    try:
        if kind == "embed":
            r = await client.post("/v1/embeddings", json={"input": prompt})
            ok, text = r.status_code == 200, None
        elif kind == "complete":
            r = await client.post("/v1/completions", json=body)
            ok = r.status_code == 200
            text = r.json()["choices"][0]["text"] if ok else None
        else:
            pieces, last, ok = [], None, False
            async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        ok = r.status_code == 200
                        break
                    now = time.perf_counter()
                    piece = json.loads(line[6:])["choices"][0]["text"]
                    if piece:
                        if last is not None:
                            phase.gaps.append(now - last)
                        last = now
                        pieces.append(piece)
            text = "".join(pieces)
        if not ok:
            phase.failures.append(f"{kind} {i}: status {r.status_code}")
        elif expected is not None and text is not None and text != expected[prompt, n]:
            phase.failures.append(f"{kind} {i}: {text!r} is not its answer alone {expected[prompt, n]!r}")
    except httpx.HTTPError as err:
        phase.failures.append(f"{kind} {i}: {type(err).__name__}: {err}")
    phase.done += 1


async def adversary(client: httpx.AsyncClient, kind: str, phase: Phase, stop: asyncio.Event, max_tokens: int,
                    viz_ok: str, viz_huge: str) -> None:
    """Send `kind` of hostile request again and again until the ordinary load is done."""
    body = {"prompt": "Hostile:", "max_tokens": max_tokens, "temperature": 0}
    while not stop.is_set():
        phase.adversarial[kind] = phase.adversarial.get(kind, 0) + 1
        try:
            if kind == "huge_stop":
                r = await client.post("/v1/completions", json={**body, "stop": ["a" * 900_000]})
                want = 422
            elif kind == "stops_at_limit":
                async with client.stream("POST", "/v1/completions",
                                         json={**body, "stream": True, "stop": AT_LIMIT}) as r:
                    async for _ in r.aiter_lines():
                        pass
                want = 200
            elif kind == "huge_viz":
                r = await client.get("/viz", params={"text": viz_huge})
                want = 413 if r.status_code != 400 else 400  # 400: over max_input_tokens before the cap
            elif kind == "viz":
                r = await client.get("/viz", params={"text": viz_ok})
                want = 200
            elif kind == "slow_reader":
                async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
                    async for _ in r.aiter_lines():
                        await asyncio.sleep(0.25)  # a client that reads far slower than tokens come
                want = 200
            else:  # "abandon": a plain completion whose client leaves before the answer
                try:
                    r = await client.post("/v1/completions", json={**body, "max_tokens": max_tokens * 4}, timeout=0.2)
                    want = r.status_code  # answered before it could leave: nothing to check
                except httpx.TimeoutException:
                    want = None
            if want is not None and r.status_code != want:
                phase.failures.append(f"adversary {kind}: status {r.status_code}, expected {want}")
        except httpx.HTTPError as err:
            phase.failures.append(f"adversary {kind}: {type(err).__name__}: {err}")
        # a few per second of each kind: enough for any stall to show, not a flood that measures only how
        # much CPU a 2-core machine has left for the ordinary clients
        await asyncio.sleep(PAUSE)


def probe_health(url: str, phase: Phase, stop: threading.Event) -> None:
    """In its own thread, with its own connection: in the clients' event loop its answer would wait behind
    every ready callback of 64 clients, timing the clients rather than the server."""
    with httpx.Client(base_url=url, timeout=30) as client:
        while not stop.is_set():
            started = time.perf_counter()
            try:
                r = client.get("/health")
                if r.status_code != 200:
                    phase.failures.append(f"/health: status {r.status_code}")
            except httpx.HTTPError as err:
                phase.failures.append(f"/health: {type(err).__name__}: {err}")
            phase.health.append(time.perf_counter() - started)
            stop.wait(0.1)


async def run_phase(url: str, requests: int, *, adversaries: bool, max_tokens: int = 12, expected: dict | None = None,
                    viz_ok: str = "the cat sat", viz_huge: str = "word " * 100, ramp: float = 0.5) -> Phase:
    """`requests` ordinary requests from CLIENTS clients (plus, with `adversaries`, one client of each hostile
    kind, in another process), /health probed all along (from a thread)."""
    phase, probing = Phase(), threading.Event()
    counter = iter(range(requests))
    # one connection pool for all clients (a connection each): 64 httpx clients would each build an SSL
    # context, seconds of CPU on a busy machine that the /health probe in this loop would wait behind
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(120.0),
                                 # idle connections are dropped before uvicorn's 5 s keep-alive closes them
                                 limits=httpx.Limits(max_connections=None, max_keepalive_connections=None,
                                                     keepalive_expiry=3.0)) as client:
        async def client_loop(k: int):
            await asyncio.sleep(ramp * k / CLIENTS)  # clients arrive over `ramp` seconds, not in one instant
            for i in counter:
                await ordinary(client, i, max_tokens, phase, expected)

        prober = threading.Thread(target=probe_health, args=(url, phase, probing), daemon=True)
        prober.start()
        # the adversaries run in a process of their own: in this one their work (encoding a 900 kB body,
        # say) would delay the ordinary clients' reading, and be timed as the server's latency
        hostile = subprocess.Popen([sys.executable, __file__, "--adversaries", url, "--max-tokens", str(max_tokens),
                                    "--viz-ok", viz_ok, "--viz-huge", viz_huge], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True) if adversaries else None
        try:
            if hostile is not None:
                await asyncio.to_thread(hostile.stdout.readline)  # "ready": they have started
            await asyncio.gather(*[client_loop(k) for k in range(CLIENTS)])
        finally:
            probing.set()
            if hostile is not None:
                out, _ = await asyncio.to_thread(hostile.communicate, "", 120)  # stdin closed: they stop
                report = json.loads(out.strip().splitlines()[-1])
                phase.adversarial, phase.failures = report["adversarial"], phase.failures + report["failures"]
            await asyncio.to_thread(prober.join)
    return phase


async def adversaries_until_stdin_closes(url: str, max_tokens: int, viz_ok: str, viz_huge: str) -> Phase:
    """One client of each hostile kind, until this process's stdin closes (see run_phase)."""
    phase, stop, loop = Phase(), asyncio.Event(), asyncio.get_running_loop()
    threading.Thread(target=lambda: (sys.stdin.read(), loop.call_soon_threadsafe(stop.set)), daemon=True).start()
    kinds = ("huge_stop", "stops_at_limit", "huge_viz", "viz", "slow_reader", "abandon")
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(120.0),
                                 limits=httpx.Limits(keepalive_expiry=3.0)) as client:
        print("ready", flush=True)
        await asyncio.gather(*[adversary(client, k, phase, stop, max_tokens, viz_ok, viz_huge) for k in kinds])
    return phase


def table(rows: dict[str, dict]) -> str:
    header = ["phase", "ITL p50 ms", "ITL p99 ms", "/health max ms", "requests", "failures"]
    lines = [[name, f"{s['p50_ms']:.1f}", f"{s['p99_ms']:.1f}", f"{s['health_max_ms']:.1f}", str(s["requests"]),
              str(s["failures"])] for name, s in rows.items()]
    widths = [max(len(r[i]) for r in lines + [header]) for i in range(len(header))]
    fmt = lambda r: "  ".join(c.rjust(w) for c, w in zip(r, widths))  # noqa: E731
    return "\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in lines])


def tiny_model(directory: Path) -> Path:
    import torch

    import attnlab
    from attnlab.config import ModelConfig
    tok = attnlab.load_tokenizer("smollm2")
    torch.manual_seed(0)
    cfg = ModelConfig(model_type="llama", vocab_size=len(tok), hidden_size=32, num_layers=2, num_heads=4,
                      num_kv_heads=2, intermediate_size=64, position="rope", norm="rmsnorm", activation="swiglu",
                      bias=False, causal=True, norm_placement="pre", embedding_norm=False, pooler=False,
                      type_vocab_size=0, pad_token_id=None, dropout=0.0, attention_dropout=0.0,
                      max_position_embeddings=256, eos_token_id=None, tie_word_embeddings=True)
    attnlab.save(attnlab.from_config(cfg).eval(), directory)
    tok.save(directory)
    return directory


def start_server(model: str, max_tokens: int, extra: list[str] = ()) -> tuple[subprocess.Popen, str]:
    """`python -m attnlab serve MODEL` on a free loopback port, once /health answers: (process, url)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("ATTNLAB_API_KEY", None)
    server = subprocess.Popen([sys.executable, "-m", "attnlab", "serve", model, "--port", str(port),
                               "--max-body-bytes", str(2 << 20), "--max-input-tokens", "64",
                               "--max-new-tokens", str(4 * max_tokens), *extra],
                              env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return server, url
        except httpx.HTTPError:
            pass
        if server.poll() is not None or time.time() > deadline:
            server.kill()
            raise RuntimeError(f"the server did not start: {server.stderr.read().decode()[-2000:]}")
        time.sleep(0.2)


def stop_server(server: subprocess.Popen) -> None:
    server.terminate()  # SIGTERM: it drains (nothing is in flight) and exits
    try:
        server.wait(60)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(10)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="packaged name or directory (default: a tiny random decoder)")
    p.add_argument("--requests", type=int, default=512, help="ordinary requests per phase")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--adversaries", metavar="URL", help=argparse.SUPPRESS)  # run_phase's hostile process
    p.add_argument("--viz-ok", default="the cat sat", help=argparse.SUPPRESS)
    p.add_argument("--viz-huge", default="word " * 100, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.adversaries:
        phase = asyncio.run(adversaries_until_stdin_closes(args.adversaries, args.max_tokens, args.viz_ok,
                                                           args.viz_huge))
        print(json.dumps({"adversarial": phase.adversarial, "failures": phase.failures}))
        return
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(tiny_model(Path(tmp) / "tiny"))
        server, url = start_server(model, args.max_tokens)
        try:
            # /viz's cap on SmolLM2 (30 layers x 9 heads) is 121 tokens: 200 words are over it
            phases = {"alone": asyncio.run(run_phase(url, args.requests, adversaries=False, max_tokens=args.max_tokens,
                                                     viz_huge="word " * 200)),
                      "with adversaries": asyncio.run(run_phase(url, args.requests, adversaries=True,
                                                                max_tokens=args.max_tokens, viz_huge="word " * 200))}
        finally:
            stop_server(server)
    summaries = {k: v.summary() for k, v in phases.items()}
    print(f"model {args.model or 'tiny random decoder (2 layers, SmolLM2 tokenizer)'}; {CLIENTS} clients, "
          f"{args.requests} ordinary requests per phase, max_tokens {args.max_tokens}")
    print(table(summaries))
    a, b = summaries["alone"], summaries["with adversaries"]
    print(f"p99 inter-token latency ratio (with / alone): {b['p99_ms'] / a['p99_ms']:.2f}; "
          f"adversarial requests sent: {b['adversarial']}")
    for f in (phases["alone"].failures + phases["with adversaries"].failures)[:20]:
        print("failure:", f)


if __name__ == "__main__":
    main()
