"""The one load generator: open-loop arrivals on schedule (or a fixed number of clients back to back)
against an HTTP endpoint, for the demo, the tests and the benchmarks.

Open loop (`rate` requests/s): arrivals leave on an even schedule whatever the answers do, with at most
`clients` requests in flight. Latency counts from the *scheduled* send time, so a generator or a service
that falls behind shows as latency instead of hiding it (no coordinated omission), and an arrival due
while every client is busy is counted in `unsent`, never sent late or dropped silently. The rate can
change while the load runs (a load step); the schedule restarts at each change.
Closed loop (`concurrency` n): n clients back to back, changeable while it runs. A closed loop measures
what a service can serve (a capacity probe); for a fixed-concurrency benchmark alone, wrk does it better.

Why raw HTTP/1.1 over asyncio streams and not an HTTP client library: httpx costs ~1 ms of CPU per
request under the GIL (measured: 32 httpx clients reached ~80 rps against a service that serves
thousands), which made the generator, not the service, the bottleneck of S2's load step. Each
connection carries one request at a time (keep-alive; a new connection opens when every open one is
busy); Content-Length, chunked and close-delimited answers are read, HTTP/1.0 answers close.

One engine, two hosts:
- `LoadGenerator`: a thread of this process with its own event loop. Each request's body comes from the
  caller's `make(client, n)`; each answer is judged by `judge(request, outcome)` and the verdict kept.
  Used by `scanflow.embedded.traffic.Traffic` (labelled rows, feedback, accuracy per model version: S1,
  tests, benchmarks/s1.py), `scanflow.demo.load.Load` (closed loop with samples: S4, the in-process S2).
- `python -m scanflow.loadgen URL BODIES.npy`: the same engine in a child process with its own GIL, for
  rates a busy test process could not send (S2's step, S3's probes), steered over stdin with JSON lines
  (`{"rate": r}`, `{"closed": n}`, `{"stop": true}`), one report per second on stdout. Used through
  `scanflow.demo.load.OpenLoad`.
Both keep one `Second` per second: sent, ok, failed, unsent, p50/p99 of the answered requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Self, TypeVar
from urllib.parse import urlsplit

import orjson

R = TypeVar("R")

JSON_HEADERS: Mapping[str, str] = {"content-type": "application/json"}
IDLE_POLL_S = 0.05  # the longest the scheduler sleeps (how soon it sees a new rate, concurrency or stop)
HEAD_LIMIT = 64 * 1024  # a response head longer than this is not an answer from a predict endpoint
SECONDS_KEPT = 3600  # per-second reports kept (an hour of load)


class ConnectError(OSError):
    """The endpoint could not be reached (refused, unreachable, or no connection within the timeout)."""


class ProtocolError(ValueError):
    """The endpoint answered something that is not an HTTP/1.x response."""


@dataclass(frozen=True)
class Request:
    """One request to send: the encoded body and whatever the judge needs to make sense of the answer."""

    content: bytes
    meta: Any = None
    headers: Mapping[str, str] = field(default_factory=lambda: JSON_HEADERS)


@dataclass(frozen=True)
class Response:
    """An answer: status, headers (names lower-cased) and body."""

    status_code: int
    headers: Mapping[str, str]
    content: bytes

    def json(self) -> Any:
        """The body as JSON; ValueError when it is not JSON."""
        return orjson.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")


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


def http_request(url: str, body: bytes, headers: Mapping[str, str] = JSON_HEADERS) -> bytes:
    """The raw HTTP/1.1 POST of `body` to `url` (keep-alive, Content-Length)."""
    u = urlsplit(url)
    target = (u.path or "/") + (f"?{u.query}" if u.query else "")
    lines = [f"POST {target} HTTP/1.1", f"Host: {u.netloc}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items() if k.lower() not in ("host", "content-length")]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def parse_head(head: bytes) -> tuple[int, dict[str, str], bool]:
    """(status, headers with lower-cased names, whether the connection stays open) of a response head;
    ProtocolError when it is not HTTP/1.x."""
    lines = head.rstrip(b"\r\n").split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise ProtocolError(f"not an HTTP/1.x response: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if sep:
            headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    connection = headers.get("connection", "").lower()
    keep = connection != "close" if parts[0] == b"HTTP/1.1" else connection == "keep-alive"
    return int(parts[1]), headers, keep


async def read_body(reader: asyncio.StreamReader, status: int, headers: Mapping[str, str]) -> tuple[bytes, bool]:
    """The body of an answer whose head was read, and whether its end was framed (False: it ran to the
    connection's end, which then cannot carry another request)."""
    if status < 200 or status in (204, 304):
        return b"", True
    if "chunked" in headers.get("transfer-encoding", "").lower():
        chunks: list[bytes] = []
        while True:
            size_line = await reader.readuntil(b"\r\n")
            try:
                size = int(size_line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise ProtocolError(f"bad chunk size {size_line[:40]!r}") from None
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers, then the blank line
                    pass
                return b"".join(chunks), True
            chunks.append(await reader.readexactly(size))
            await reader.readexactly(2)
    length = headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise ProtocolError(f"bad content-length {length[:40]!r}")
        return await reader.readexactly(int(length)), True
    return await reader.read(), False


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


class LoadGenerator(Generic[R]):
    """`with LoadGenerator(url, make, judge, clients=4, rate=100) as gen: ...; gen.results()`

    The engine in a thread of this process. With `rate`, an open loop; without, a closed loop of
    `concurrency` clients (default: all `clients`); either knob may change while it runs.
    judge(request, outcome) -> R: what to keep of one answer; it runs on the generator's event loop, so
    it must be quick. A ValueError it raises on an answer counts as no answer (judged again with status 0
    and the error); on a status-0 outcome it must not raise.
    """

    def __init__(self, url: str, make: Callable[[int, int], Request], judge: Callable[[Request, Outcome], R],
                 *, clients: int, timeout_s: float = 10.0, rate: float | None = None,
                 concurrency: int | None = None, error_pause_s: float = 0.0,
                 results: list[R] | None = None, name: str = "loadgen") -> None:
        if clients < 1:
            raise ValueError(f"clients must be >= 1, got {clients}")
        if rate is not None and rate <= 0:
            raise ValueError(f"rate must be > 0 (or None for a closed loop), got {rate}")
        if rate is not None and concurrency is not None:
            raise ValueError("concurrency applies to the closed loop only, not with rate")
        if concurrency is not None and not 0 <= concurrency <= clients:
            raise ValueError(f"concurrency must be in [0, clients={clients}], got {concurrency}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.judge = judge
        self.timeout_s = timeout_s
        self.name = name
        self._results: list[R] = [] if results is None else results
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.engine = Engine(url, make, self._keep, clients=clients, timeout_s=timeout_s, rate=rate or 0.0,
                             concurrency=(clients if concurrency is None else concurrency) if rate is None else 0,
                             error_pause_s=error_pause_s)

    # -- control ---------------------------------------------------------------------------------
    def start(self) -> Self:
        if self._thread is not None:
            raise RuntimeError(f"{self.name} already started (a generator runs once)")
        self._thread = threading.Thread(target=lambda: asyncio.run(self.engine.run(self._stop.is_set)),
                                        name=self.name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sending, let the requests in flight finish (bounded by the timeout) and wait for the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- knobs and counters ------------------------------------------------------------------------
    @property
    def rate(self) -> float:
        return self.engine.rate

    @rate.setter
    def rate(self, per_s: float) -> None:
        self.engine.rate = per_s

    @property
    def concurrency(self) -> int:
        return self.engine.concurrency

    @concurrency.setter
    def concurrency(self, n: int) -> None:
        self.engine.concurrency = n

    @property
    def in_flight(self) -> int:
        return self.engine.in_flight

    @property
    def sent(self) -> int:
        return self.engine.sent

    @property
    def unsent(self) -> int:
        return self.engine.unsent

    def seconds(self, since: float = 0.0) -> list[Second]:
        return [s for s in list(self.engine.seconds) if s.t >= since]

    # -- results ---------------------------------------------------------------------------------
    def results(self) -> list[R]:
        """A copy of everything kept so far, in arrival order."""
        with self._lock:
            return list(self._results)

    def _keep(self, req: Request, out: Outcome) -> bool:
        try:
            kept = self.judge(req, out)
        except ValueError as exc:  # the answer's body could not be read: no answer
            out = Outcome(0, out.latency_ms, out.t_monotonic, out.t_wall, None, exc, out.scheduled)
            kept = self.judge(req, out)
        with self._lock:
            self._results.append(kept)
        return out.response is not None


def measure_closed_loop(url: str, content: bytes, clients: int, seconds: float, *,
                        warmup_s: float = 0.5, timeout_s: float = 10.0) -> dict[str, float]:
    """`clients` back to back for `warmup_s + seconds` (a thread of this process); over the measured
    `seconds`: the median of the per-second answered counts (`rps`, robust to a stalled second on a busy
    machine), p50/p99 latency of the answered requests (ms) and `errors` (no answer or not 200).
    For a benchmark without wrk; with wrk installed, wrk measures a fixed concurrency better."""

    def judge(req: Request, out: Outcome) -> tuple[float, float, bool]:
        return out.t_monotonic, out.latency_ms, out.status == 200

    gen = LoadGenerator(url, lambda c, n: Request(content), judge, clients=clients, timeout_s=timeout_s,
                        error_pause_s=0.05, name="closed-loop")
    with gen:
        t_begin = time.monotonic() + warmup_s
        time.sleep(warmup_s + seconds)
    got = [r for r in gen.results() if t_begin <= r[0] < t_begin + seconds]
    windows = [0] * max(1, int(seconds))
    for t, _, ok in got:
        if ok and int(t - t_begin) < len(windows):
            windows[int(t - t_begin)] += 1
    latencies = [ms for _, ms, ok in got if ok]
    return {"rps": float(statistics.median(windows)),
            "p50_ms": percentile(latencies, 0.5) or float("nan"),
            "p99_ms": percentile(latencies, 0.99) or float("nan"),
            "errors": float(sum(1 for _, _, ok in got if not ok))}


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


# -- the child-process host ----------------------------------------------------------------------
def _second_line(s: Second) -> str:
    return json.dumps({"t": s.t, "rate": s.rate, "closed": s.closed, "sent": s.sent, "ok": s.ok,
                       "failed": s.failed, "unsent": s.unsent, "p50_ms": s.p50_ms, "p99_ms": s.p99_ms,
                       "in_flight": s.in_flight})


def parse_second(line: str) -> Second:
    """One stdout line of the child host; ValueError when it is not one."""
    try:
        d = json.loads(line)
        return Second(float(d["t"]), float(d["rate"]), int(d["sent"]), int(d["ok"]), int(d["failed"]),
                      int(d["unsent"]), d["p50_ms"], d["p99_ms"], int(d["in_flight"]), int(d.get("closed", 0)))
    except (KeyError, TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not a load report: {line[:80]!r}") from exc


def apply_command(engine: Engine, line: str | bytes) -> bool:
    """Apply one stdin command to the engine; False once it says stop (or is not a command at all)."""
    try:
        cmd = json.loads(line)
        if not isinstance(cmd, dict) or cmd.get("stop"):
            return False
        if "rate" in cmd:
            engine.rate = float(cmd["rate"])
        elif "closed" in cmd:
            engine.concurrency = min(int(cmd["closed"]), engine.clients)
        return True
    except (ValueError, TypeError):
        sys.stderr.write(f"loadgen: ignored a command that is not one: {line[:80]!r}\n")
        return True


async def _serve_child(engine: Engine) -> None:
    """Run the engine, apply stdin's commands and print each second's report as one JSON line."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    async def commands() -> None:
        while not engine.stopping:
            line = await reader.readline()
            if not line or not apply_command(engine, line):  # EOF: the parent is gone
                engine.stopping = True

    command_task = loop.create_task(commands())
    run_task = loop.create_task(engine.run(lambda: False))
    printed = 0.0
    while not run_task.done():
        await asyncio.wait({run_task}, timeout=0.05)
        fresh = [s for s in list(engine.seconds) if s.t > printed]
        if fresh:
            sys.stdout.write("".join(_second_line(s) + "\n" for s in fresh))
            sys.stdout.flush()
            printed = fresh[-1].t
    command_task.cancel()
    run_task.result()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="An open-loop load generator in its own process, steered over stdin.")
    ap.add_argument("url", help="the predict URL, e.g. http://127.0.0.1:8000/predict")
    ap.add_argument("bodies", help="a .npy file of rows (one row per request, sent in turn)")
    ap.add_argument("--max-connections", type=int, default=2048)
    ap.add_argument("--timeout-s", type=float, default=10.0)
    a = ap.parse_args(argv)
    import numpy as np

    rows = np.load(a.bodies).astype(np.float32)
    bodies = [Request(orjson.dumps({"inputs": [r.tolist()]})) for r in rows]
    turn = iter(range(1 << 62))
    engine = Engine(a.url, lambda client, n: bodies[next(turn) % len(bodies)], lambda r, o: o.response is not None,
                    clients=a.max_connections, timeout_s=a.timeout_s)
    try:
        import uvloop
    except ImportError:  # optional: the standard loop sends less per CPU second, same schedule
        asyncio.run(_serve_child(engine))
    else:
        uvloop.run(_serve_child(engine))


if __name__ == "__main__":
    main()
