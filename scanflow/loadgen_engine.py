"""The load generator's engine: the sender on one event loop that schedules open-loop arrivals (or runs
clients back to back), over a pool of keep-alive connections, and counts what happened each second
(`Second`). Separate from its two hosts (scanflow.loadgen: a thread of this process, or a child process
steered over stdin) because it is the same engine under both, and tests drive it directly.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from scanflow.loadgen_http import ConnectError, Request, Response, http_request, parse_head, read_body

IDLE_POLL_S = 0.05  # the longest the scheduler sleeps (how soon it sees a new rate, concurrency or stop)
HEAD_LIMIT = 64 * 1024  # a response head longer than this is not an answer from a predict endpoint
SECONDS_KEPT = 3600  # per-second reports kept (an hour of load)


@dataclass(frozen=True)
class Outcome:
    """What came back for one request. `status` 0 and `error` set: no usable answer (connection error,
    timeout, or the judge could not read the body and said so by raising ValueError)."""

    status: int
    latency_ms: float
    t_monotonic: float  # time.monotonic() when the answer came
    t_wall: float  # time.time() when the answer came
    response: Response | None = None
    error: Exception | None = None
    scheduled: float | None = None  # time.monotonic() the request was due (open loop; latency counts from it)


@dataclass(frozen=True)
class Second:
    """One second of load; latencies in ms of the answered (200) requests, from the scheduled send time
    in the open loop; `unsent`: arrivals due while every client was busy."""

    t: float  # time.monotonic() at the end of the second (one clock for every process on Linux)
    rate: float  # the open-loop rate in force (0 in a closed loop)
    sent: int
    ok: int
    failed: int
    unsent: int
    p50_ms: float | None
    p99_ms: float | None
    in_flight: int
    closed: int = 0  # clients back to back (0 in the open loop)


def due_count(rate: float, start: float, now: float, dispatched: int) -> int:
    """Pure: arrivals due at `now` on an even schedule of `rate`/s from `start`, not yet dispatched (sent
    or counted unsent). The schedule never restarts: a generator that fell behind owes every arrival."""
    return max(0, int((now - start) * rate) + 1 - dispatched) if rate > 0 else 0


def percentile(values: list[float], q: float) -> float | None:
    """Pure: nearest-rank q-quantile, None when empty."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(q * len(s) + 0.999999) - 1))]


Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class Engine:
    """The sender, on one event loop: schedules arrivals (open loop) or runs clients back to back
    (closed loop), over a pool of keep-alive connections, and counts what happened each second.

    make(client, n) -> Request: the n-th request of client `client` (0 .. clients-1; in the open loop a
    client is an in-flight slot). on_answer(request, outcome) is called on the loop for every request.
    `rate` and `concurrency` may be set from any thread while it runs; setting one clears the other.
    """

    def __init__(self, url: str, make: Callable[[int, int], Request],
                 on_answer: Callable[[Request, Outcome], bool], *, clients: int, timeout_s: float,
                 rate: float = 0.0, concurrency: int = 0, error_pause_s: float = 0.05) -> None:
        u = urlsplit(url)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"the load generator speaks plain http://host:port/path, got {url!r}")
        self.url, self.host, self.port = url, u.hostname, u.port or 80
        self.make, self.on_answer = make, on_answer
        self.clients, self.timeout_s, self.error_pause_s = clients, timeout_s, error_pause_s
        self._rate, self._concurrency = float(rate), int(concurrency)
        self._changed = True
        self.stopping = False
        self.in_flight = 0  # requests sent and not yet answered (a gauge)
        self.sent = 0
        self.unsent = 0
        self.seconds: deque[Second] = deque(maxlen=SECONDS_KEPT)
        self._idle: deque[Conn] = deque()
        self._counts = [0] * clients
        self._period = _Period()

    # -- knobs (any thread) ----------------------------------------------------------------------
    @property
    def rate(self) -> float:
        return self._rate

    @rate.setter
    def rate(self, per_s: float) -> None:
        if per_s < 0:
            raise ValueError(f"rate must be >= 0, got {per_s}")
        self._rate, self._concurrency, self._changed = float(per_s), 0, True

    @property
    def concurrency(self) -> int:
        return self._concurrency

    @concurrency.setter
    def concurrency(self, n: int) -> None:
        if not 0 <= n <= self.clients:
            raise ValueError(f"concurrency must be in [0, {self.clients}], got {n}")
        self._concurrency, self._rate, self._changed = int(n), 0.0, True

    # -- the loop ----------------------------------------------------------------------------------
    async def run(self, stop: Callable[[], bool]) -> None:
        loop = asyncio.get_running_loop()
        free = list(range(self.clients - 1, -1, -1))  # open loop: idle in-flight slots
        tasks: set[asyncio.Task[None]] = set()
        closed_running: set[int] = set()
        start, dispatched, rate = time.monotonic(), 0, 0.0
        next_report = time.monotonic() + 1.0

        def spawn(coro: Any) -> None:
            task = loop.create_task(coro)
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        async def open_one(slot: int, scheduled: float) -> None:
            try:
                await self._one(slot, scheduled, open_loop=True)
            finally:
                free.append(slot)

        async def closed_client(k: int) -> None:
            try:
                while not self.stopping and k < self._concurrency:
                    if not await self._one(k, time.monotonic(), open_loop=False) and self.error_pause_s:
                        await asyncio.sleep(self.error_pause_s)  # a refused connection must not spin
            finally:
                closed_running.discard(k)

        while not (self.stopping or stop()):
            now = time.monotonic()
            if self._changed:
                self._changed, rate, start, dispatched = False, self._rate, now, 0
                for k in range(self._concurrency):
                    if k not in closed_running:
                        closed_running.add(k)
                        spawn(closed_client(k))
            for _ in range(due_count(rate, start, now, dispatched)):
                scheduled = start + dispatched / rate
                dispatched += 1
                if not free:
                    self.unsent += 1
                    self._period.unsent += 1
                    continue
                spawn(open_one(free.pop(), scheduled))
            if now >= next_report:
                self._report(next_report, rate)
                next_report += 1.0
                if now >= next_report:  # a stalled loop reports the seconds it missed as one
                    next_report = now + 1.0
            wake = min(next_report, start + dispatched / rate if rate > 0 else next_report, now + IDLE_POLL_S)
            await asyncio.sleep(max(0.0, wake - time.monotonic()))
        self.stopping = True
        if tasks:
            await asyncio.wait(tasks, timeout=self.timeout_s + 1.0)
        while self._idle:
            self._idle.popleft()[1].close()

    async def _one(self, client: int, scheduled: float, *, open_loop: bool) -> bool:
        """Send one request; time it from `scheduled`; hand it to on_answer. True when answered."""
        req = self.make(client, self._counts[client])
        self._counts[client] += 1
        self.in_flight += 1
        self.sent += 1
        self._period.sent += 1
        response: Response | None = None
        error: Exception | None = None
        try:
            response = await asyncio.wait_for(self._exchange(req), self.timeout_s)
        except TimeoutError as exc:
            error = TimeoutError(f"no answer within {self.timeout_s} s") if not str(exc) else exc
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            error = exc
        finally:
            self.in_flight -= 1
        now = time.monotonic()
        latency_ms = (now - scheduled) * 1000.0
        out = Outcome(0 if response is None else response.status_code, latency_ms, now, time.time(), response,
                      error, scheduled if open_loop else None)
        answered = self.on_answer(req, out)
        if answered and response is not None and response.status_code == 200:
            self._period.ok += 1
            self._period.latencies.append(latency_ms)
        else:
            self._period.failed += 1
        return answered

    async def _exchange(self, req: Request) -> Response:
        conn = self._reusable() or await self._connect()
        reader, writer = conn
        try:
            writer.write(http_request(self.url, req.content, req.headers))
            head = await reader.readuntil(b"\r\n\r\n")
            status, headers, keep = parse_head(head)
            body, framed = await read_body(reader, status, headers)
        except BaseException:
            writer.close()
            raise
        if keep and framed and not self.stopping:
            self._idle.append(conn)
        else:
            writer.close()
        return Response(status, headers, body)

    def _reusable(self) -> Conn | None:
        """An idle connection the server has not closed meanwhile (a server's keep-alive timeout closes
        idle ones: reusing one would fail a request the server never saw)."""
        while self._idle:
            reader, writer = conn = self._idle.popleft()
            if not reader.at_eof() and not writer.is_closing():
                return conn
            writer.close()
        return None

    async def _connect(self) -> Conn:
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port, limit=HEAD_LIMIT)
        except OSError as exc:
            raise ConnectError(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return reader, writer

    def _report(self, t: float, rate: float) -> None:
        p, self._period = self._period, _Period()
        self.seconds.append(Second(round(t, 3), rate, p.sent, p.ok, p.failed, p.unsent,
                                   percentile(p.latencies, 0.5), percentile(p.latencies, 0.99),
                                   self.in_flight, self._concurrency))


@dataclass
class _Period:
    """What happened since the last report."""

    sent: int = 0
    ok: int = 0
    failed: int = 0
    unsent: int = 0
    latencies: list[float] = field(default_factory=list)
