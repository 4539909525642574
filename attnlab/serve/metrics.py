"""Counters and latency percentiles for GET /metrics (JSON). Latencies are kept for the most recent
requests only (a bounded window), so the percentiles describe the server now, not since it started."""
from __future__ import annotations

import threading
from collections import Counter, defaultdict, deque


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


class Metrics:
    def __init__(self, window: int = 1000) -> None:
        self.requests: Counter = Counter()        # (endpoint, status) -> count
        self.tokens: Counter = Counter()          # prompt / completion / embedded
        self.latency: dict[str, deque] = defaultdict(lambda: deque(maxlen=window))
        self.first_token: deque = deque(maxlen=window)
        self._lock = threading.Lock()

    def record(self, endpoint: str, status: int, seconds: float | None = None) -> None:
        with self._lock:
            self.requests[(endpoint, status)] += 1
            if seconds is not None and status < 400:
                self.latency[endpoint].append(seconds)

    def add_tokens(self, kind: str, n: int) -> None:
        with self._lock:
            self.tokens[kind] += n

    def snapshot(self) -> dict:
        with self._lock:
            by_endpoint: dict[str, dict] = defaultdict(dict)
            for (endpoint, status), n in self.requests.items():
                by_endpoint[endpoint][str(status)] = n
            latency = {e: {f"p{q}": percentile(list(v), q) for q in (50, 90, 99)} | {"count": len(v)}
                       for e, v in self.latency.items()}
            ttft = {f"p{q}": percentile(list(self.first_token), q) for q in (50, 90, 99)}
            return {"requests": dict(by_endpoint), "requests_total": sum(self.requests.values()),
                    "tokens": dict(self.tokens), "latency_s": latency, "time_to_first_token_s": ttft}
