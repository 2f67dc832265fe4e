"""One load generator for every caller that drives a predict endpoint from synchronous code.

`LoadGenerator` runs `clients` async workers in a thread of its own (its own event loop), so a scenario,
a test or a benchmark starts it with `with ...:` and reads results while it runs. Each worker posts the
body its caller's `make(worker, n)` returns, times the answer, and keeps what its caller's
`judge(request, outcome)` makes of it. Optional: a total request-rate cap (`rate`, spread over the
workers; closed loop below it), a gate that idles workers (`active(worker)`, e.g. a concurrency knob
changed while the load runs) and a pause after a failed request so a refused connection does not spin.
What a request carries and what is kept of an answer is the caller's business: this module only sends,
times and stores.
Who calls: scanflow.demo.load.Load (concurrency-steered, latency samples: S2, S3, S4) and
scanflow.embedded.traffic.Traffic (rate-capped, labelled rows, accuracy per model version: S1, tests/e2e,
benchmarks/s1.py, notebooks).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Self, TypeVar

import httpx

R = TypeVar("R")

JSON_HEADERS: Mapping[str, str] = {"content-type": "application/json"}
IDLE_POLL_S = 0.05  # how often an idle (gated-off) worker looks at its gate again


@dataclass(frozen=True)
class Request:
    """One request to send: the encoded body and whatever the judge needs to make sense of the answer."""

    content: bytes
    meta: Any = None
    headers: Mapping[str, str] = field(default_factory=lambda: JSON_HEADERS)


@dataclass(frozen=True)
class Outcome:
    """What came back for one request. `status` 0 and `error` set: no usable answer (connection error,
    timeout, or the judge could not read the body and said so by raising ValueError)."""

    status: int
    latency_ms: float
    t_monotonic: float  # time.monotonic() when the answer came
    t_wall: float  # time.time() when the answer came
    response: httpx.Response | None = None
    error: Exception | None = None


def pace(next_at: float, period: float, now: float) -> tuple[float, float]:
    """Pure rate pacing of one worker: (seconds to sleep, next due time) after a request due at
    `next_at`. A worker that fell behind starts afresh from `now` instead of bursting to catch up."""
    due = next_at + period
    delay = due - now
    return (delay, due) if delay > 0 else (0.0, now)


class LoadGenerator(Generic[R]):
    """`with LoadGenerator(url, make, judge, clients=4) as gen: ...; gen.results()`

    make(worker, n) -> Request: the n-th request (0, 1, ...) of worker `worker` (0 .. clients-1).
    judge(request, outcome) -> R: what to keep of one answer; it runs on the generator's event loop, so
    it must be quick. A ValueError it raises on an answer counts as no answer (judged again with
    status 0 and the error); on a status-0 outcome it must not raise.
    """

    def __init__(self, url: str, make: Callable[[int, int], Request], judge: Callable[[Request, Outcome], R],
                 *, clients: int, timeout_s: float = 10.0, rate: float | None = None,
                 active: Callable[[int], bool] | None = None, error_pause_s: float = 0.0,
                 results: list[R] | None = None, name: str = "loadgen") -> None:
        if clients < 1:
            raise ValueError(f"clients must be >= 1, got {clients}")
        if rate is not None and rate <= 0:
            raise ValueError(f"rate must be > 0 (or None for a closed loop), got {rate}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.url = url
        self.make = make
        self.judge = judge
        self.clients = clients
        self.timeout_s = timeout_s
        self.rate = rate
        self.active = active
        self.error_pause_s = error_pause_s
        self.name = name
        self.in_flight = 0  # requests sent and not yet answered (read from any thread; a gauge, not exact)
        self._results: list[R] = [] if results is None else results
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- control ---------------------------------------------------------------------------------
    def start(self) -> Self:
        if self._thread is not None:
            raise RuntimeError(f"{self.name} already started (a generator runs once)")
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name=self.name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ask every worker to finish its current request and wait for the thread (bounded)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- results ---------------------------------------------------------------------------------
    def results(self) -> list[R]:
        """A copy of everything kept so far, in arrival order."""
        with self._lock:
            return list(self._results)

    # -- the load --------------------------------------------------------------------------------
    async def _main(self) -> None:
        limits = httpx.Limits(max_connections=self.clients, max_keepalive_connections=self.clients)
        async with httpx.AsyncClient(timeout=self.timeout_s, limits=limits) as http:
            await asyncio.gather(*(self._worker(i, http) for i in range(self.clients)))

    async def _worker(self, i: int, http: httpx.AsyncClient) -> None:
        period = None if self.rate is None else self.clients / self.rate
        next_at = time.monotonic()
        n = 0
        while not self._stop.is_set():
            if self.active is not None and not self.active(i):
                await asyncio.sleep(IDLE_POLL_S)
                continue
            req = self.make(i, n)
            n += 1
            kept, failed = await self._send(http, req)
            with self._lock:
                self._results.append(kept)
            if failed and self.error_pause_s > 0:
                await asyncio.sleep(self.error_pause_s)
            if period is not None:
                delay, next_at = pace(next_at, period, time.monotonic())
                if delay > 0:
                    await asyncio.sleep(delay)

    async def _send(self, http: httpx.AsyncClient, req: Request) -> tuple[R, bool]:
        t0 = time.monotonic()
        self.in_flight += 1
        try:
            r = await http.post(self.url, content=req.content, headers=req.headers)
            now = time.monotonic()
            return self.judge(req, Outcome(r.status_code, (now - t0) * 1000, now, time.time(), r)), False
        except (httpx.HTTPError, ValueError) as exc:
            now = time.monotonic()
            return self.judge(req, Outcome(0, (now - t0) * 1000, now, time.time(), None, exc)), True
        finally:
            self.in_flight -= 1


class GeneratorOwner:
    """Mixin for wrappers that own a `LoadGenerator` as `_gen`: start / stop / `with` delegate to it,
    so each wrapper keeps only what it sends and what it keeps (scanflow.demo.load.Load,
    scanflow.embedded.traffic.Traffic)."""

    _gen: LoadGenerator[Any]

    def start(self) -> Self:
        self._gen.start()
        return self

    def stop(self) -> None:
        self._gen.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
