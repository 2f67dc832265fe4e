"""A closed-loop load generator whose concurrency can change while it runs (the S2 step, S3 probes, S4).

Each of up to `max_clients` workers sends one-row predict requests back to back while its index is
below `concurrency`; every answer is kept as a `Sample` (when, latency, status, which upstream served
it, model version). It runs in its own thread with its own event loop, so scenario code stays
synchronous. Window statistics are pure functions over samples, testable without a server.
Who calls: scanflow.demo.s2_autoscale, s3_tune, s4_failover; notebooks.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Self

import httpx
import numpy as np


@dataclass(frozen=True)
class Sample:
    t: float  # time.monotonic() when the answer came
    latency_ms: float
    status: int  # 0 = no answer (connection error, timeout)
    upstream: str | None = None  # x-scanflow-upstream: which replica / backup served it
    version: str | None = None


@dataclass(frozen=True)
class Window:
    count: int
    rps: float
    p99_ms: float | None
    errors: int


def quantile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile (nearest rank) of values, None when empty."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def window(samples: Sequence[Sample], t0: float, t1: float, q: float = 0.99) -> Window:
    """Statistics of the answers that came in [t0, t1)."""
    got = [s for s in samples if t0 <= s.t < t1]
    ok = [s.latency_ms for s in got if s.status == 200]
    span = max(1e-9, t1 - t0)
    return Window(len(got), len(ok) / span, quantile(ok, q), sum(1 for s in got if s.status != 200))


class Load:
    """`with Load(url, rows, concurrency=2) as load: ...; load.concurrency = 16; load.window(...)`"""

    def __init__(self, url: str, rows: np.ndarray, *, concurrency: int = 1, max_clients: int = 32,
                 timeout_s: float = 10.0) -> None:
        if not 0 <= concurrency <= max_clients or max_clients < 1:
            raise ValueError(f"need 0 <= concurrency <= max_clients >= 1, got {concurrency}, {max_clients}")
        self.url = url.rstrip("/") + "/predict"
        self.bodies = [orjson_body(r) for r in np.asarray(rows, dtype=np.float32)[:512]]
        self.concurrency = concurrency
        self.max_clients = max_clients
        self.timeout_s = timeout_s
        self._samples: list[Sample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.in_flight = 0

    def start(self) -> Self:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="demo-load", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def samples(self, since: float = 0.0) -> list[Sample]:
        with self._lock:
            return [s for s in self._samples if s.t >= since]

    def window(self, seconds: float, now: float | None = None) -> Window:
        now = time.monotonic() if now is None else now
        return window(self.samples(now - seconds), now - seconds, now)

    async def _main(self) -> None:
        limits = httpx.Limits(max_connections=self.max_clients, max_keepalive_connections=self.max_clients)
        async with httpx.AsyncClient(timeout=self.timeout_s, limits=limits) as http:
            await asyncio.gather(*(self._worker(i, http) for i in range(self.max_clients)))

    async def _worker(self, i: int, http: httpx.AsyncClient) -> None:
        j = i
        headers = {"content-type": "application/json"}
        while not self._stop.is_set():
            if i >= self.concurrency:
                await asyncio.sleep(0.05)  # idle worker: cheap poll of the concurrency knob
                continue
            body = self.bodies[j % len(self.bodies)]
            j += self.max_clients
            t0 = time.monotonic()
            self.in_flight += 1
            try:
                r = await http.post(self.url, content=body, headers=headers)
                version = None
                if r.status_code == 200:
                    version = r.json().get("model_version")
                s = Sample(time.monotonic(), (time.monotonic() - t0) * 1000, r.status_code,
                           r.headers.get("x-scanflow-upstream"), None if version is None else str(version))
            except (httpx.HTTPError, ValueError):
                s = Sample(time.monotonic(), (time.monotonic() - t0) * 1000, 0)
                await asyncio.sleep(0.05)  # a refused connection must not spin
            finally:
                self.in_flight -= 1
            with self._lock:
                self._samples.append(s)


def orjson_body(row: np.ndarray) -> bytes:
    import orjson

    return orjson.dumps({"inputs": [row.tolist()]})
