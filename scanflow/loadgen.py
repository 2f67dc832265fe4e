"""One load generator for every caller that drives a predict endpoint from synchronous code.

`LoadGenerator` runs in a thread of its own (its own event loop), so a scenario, a test or a benchmark
starts it with `with ...:` and reads results while it runs. Each request carries the body its caller's
`make(slot, n)` returns; its answer is timed and `judge(request, outcome)` decides what is kept.
Two modes:
- open loop (`rate` requests/s): arrivals on a fixed schedule (evenly spaced) whatever the answers do,
  up to `clients` requests in flight. Latency counts from the *scheduled* send time, so a generator or
  a service that falls behind shows as latency instead of hiding it (no coordinated omission), and an
  arrival due while every slot is busy is counted in `unsent`, never sent late or dropped silently.
  What the demo, the tests and the benchmarks use to load a service.
- fixed concurrency (`rate` None): `clients` workers back to back, each gated by `active(slot)` (a
  concurrency knob changed while the load runs), with a pause after a failed request so a refused
  connection does not spin. For capacity probes (a closed loop measures what a service can serve).
What a request carries and what is kept of an answer is the caller's business: this module only sends,
times and stores. The open-loop generator for rates above what one Python thread sends (S2's step) runs
in a child process of its own: scanflow.demo.openload, with the same schedule and counting rules.
Who calls: scanflow.demo.load.Load (fixed concurrency, latency samples: S2 in-process, S4),
scanflow.embedded.traffic.Traffic (open loop, labelled rows, feedback as an option, accuracy per model
version: S1, tests/e2e, benchmarks/s1.py, notebooks).
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
    scheduled: float | None = None  # time.monotonic() the request was due (open loop; latency counts from it)


def due_count(rate: float, start: float, now: float, dispatched: int) -> int:
    """Pure: arrivals due at `now` on an even schedule of `rate`/s from `start`, not yet dispatched (sent
    or counted unsent). The schedule never restarts: a generator that fell behind owes every arrival."""
    return max(0, int((now - start) * rate) + 1 - dispatched) if rate > 0 else 0


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
        if rate is not None and active is not None:
            raise ValueError("active (a concurrency gate) applies to the fixed-concurrency mode only, not with rate")
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
        self.unsent = 0  # open loop: arrivals due while every slot was busy (never sent)
        self.sent = 0  # requests sent
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
            if self.rate is None:
                await asyncio.gather(*(self._worker(i, http) for i in range(self.clients)))
            else:
                await self._open_loop(http, self.rate)

    async def _open_loop(self, http: httpx.AsyncClient, rate: float) -> None:
        """Dispatch arrivals on schedule to free slots; an arrival with no free slot is unsent."""
        free = list(range(self.clients - 1, -1, -1))
        counts = [0] * self.clients
        tasks: set[asyncio.Task[None]] = set()
        start, dispatched = time.monotonic(), 0

        async def one(slot: int, req: Request, scheduled: float) -> None:
            try:
                kept, _ = await self._send(http, req, scheduled)
                with self._lock:
                    self._results.append(kept)
            finally:
                free.append(slot)

        while not self._stop.is_set():
            now = time.monotonic()
            for _ in range(due_count(rate, start, now, dispatched)):
                scheduled = start + dispatched / rate
                dispatched += 1
                if not free:
                    self.unsent += 1
                    continue
                slot = free.pop()
                req = self.make(slot, counts[slot])
                counts[slot] += 1
                task = asyncio.get_running_loop().create_task(one(slot, req, scheduled))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            await asyncio.sleep(min(IDLE_POLL_S, max(0.0, start + dispatched / rate - time.monotonic())))
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _worker(self, i: int, http: httpx.AsyncClient) -> None:
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

    async def _send(self, http: httpx.AsyncClient, req: Request, scheduled: float | None = None) -> tuple[R, bool]:
        t0 = time.monotonic() if scheduled is None else scheduled
        self.in_flight += 1
        self.sent += 1
        try:
            r = await http.post(self.url, content=req.content, headers=req.headers)
            now = time.monotonic()
            return self.judge(req, Outcome(r.status_code, (now - t0) * 1000, now, time.time(), r,
                                           scheduled=scheduled)), False
        except (httpx.HTTPError, ValueError) as exc:
            now = time.monotonic()
            return self.judge(req, Outcome(0, (now - t0) * 1000, now, time.time(), None, exc,
                                           scheduled=scheduled)), True
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
