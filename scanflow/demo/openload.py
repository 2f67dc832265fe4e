"""An open-loop arrival-rate load generator in its own process, steered over stdin (S2's load step).

Why its own module and process: a closed loop (scanflow.demo.load) sends the next request only when the
last one came back, so an overloaded service slows its own load down; and httpx-based clients in the
demo's process cost ~1 ms of CPU per request under the GIL (measured: 32 httpx clients reached ~80 rps
against a service that serves thousands). Here requests leave on a schedule (`rate` per second, evenly
spaced) whatever the answers do, over raw HTTP/1.1 keep-alive sockets (one request per connection at a
time; a new connection opens when every open one is busy, up to `max_connections`), on uvloop when
available, in a child process with its own GIL. Latency counts from the *scheduled* send time, so a
generator that falls behind shows it as latency instead of hiding it (no coordinated omission), and
arrivals it could not send at all (every connection busy) are counted as `unsent`, never dropped silently.

Protocol (JSON lines): stdin takes `{"rate": r}` (requests/s, 0 = idle), `{"closed": n}` (n connections
back to back: a capacity probe) or `{"stop": true}`; stdout gives one line per second:
`{"t", "rate", "sent", "ok", "failed", "unsent", "p50_ms", "p99_ms", "in_flight", "conns"}`.
Run: `python -m scanflow.demo.openload URL BODIES.npy [--max-connections N] [--timeout-s S]`.
Who calls: scanflow.demo.s2_autoscale and s3_tune through `OpenLoad` (scanflow.demo.load).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from urllib.parse import urlsplit

SECOND = 1.0
TICK_S = 0.002  # the scheduler's resolution: sends due within a tick leave together


@dataclass
class Stats:
    """What happened in one reporting second (latencies in ms, from the scheduled send time)."""

    sent: int = 0
    ok: int = 0
    failed: int = 0
    unsent: int = 0
    latencies: list[float] = field(default_factory=list)


def percentile(values: list[float], q: float) -> float | None:
    """Pure: nearest-rank q-quantile, None when empty."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(q * len(s) + 0.999999) - 1))]


def due(rate: float, since: float, now: float, sent: int) -> int:
    """Pure: how many more requests are due at `now` for an even `rate` started at `since`, with `sent`
    already sent (or counted unsent) since then."""
    if rate <= 0:
        return 0
    return max(0, int((now - since) * rate) - sent)


def http_request(url: str, body: bytes) -> bytes:
    """The raw HTTP/1.1 POST for `body` (keep-alive, Content-Length)."""
    u = urlsplit(url)
    head = (f"POST {u.path or '/'} HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


def parse_head(head: bytes) -> tuple[int, int]:
    """(status, content length) of a response head; ValueError when it is not HTTP."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
        raise ValueError(f"not an HTTP response: {lines[0][:80]!r}")
    length = 0
    for line in lines[1:]:
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    return int(parts[1]), length


class Generator:
    """The sender: a scheduler that hands due requests to idle connections (opening more when all are busy)."""

    def __init__(self, url: str, requests: list[bytes], max_connections: int, timeout_s: float) -> None:
        u = urlsplit(url)
        self.host, self.port = u.hostname or "127.0.0.1", int(u.port or 80)
        self.requests = requests
        self.max_connections = max_connections
        self.timeout_s = timeout_s
        self.idle: deque[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = deque()
        self.conns = 0
        self.in_flight = 0
        self.n = 0
        self.stats = Stats()
        self.rate = 0.0
        self.closed = 0
        self.stop = False

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), self.timeout_s)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            import socket

            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return reader, writer

    async def _one(self, scheduled: float, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None) -> bool:
        """Send one request (on `conn`, or a new connection); record it; return the connection to the pool."""
        self.in_flight += 1
        req = self.requests[self.n % len(self.requests)]
        self.n += 1
        ok = False
        try:
            if conn is None:
                conn = await self._connect()
            reader, writer = conn
            writer.write(req)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.timeout_s)
            status, length = parse_head(head)
            await asyncio.wait_for(reader.readexactly(length), self.timeout_s)
            ok = status == 200
            self.idle.append(conn)
        except (TimeoutError, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            if conn is not None:
                conn[1].close()
            self.conns -= 1
        finally:
            self.in_flight -= 1
        self.stats.sent += 1
        if ok:
            self.stats.ok += 1
            self.stats.latencies.append((time.monotonic() - scheduled) * 1000.0)
        else:
            self.stats.failed += 1
        return ok

    def _dispatch(self, scheduled: float) -> None:
        if self.idle:
            conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = self.idle.popleft()
        elif self.conns < self.max_connections:
            conn, self.conns = None, self.conns + 1
        else:
            self.stats.unsent += 1
            return
        asyncio.get_running_loop().create_task(self._one(scheduled, conn))

    async def _closed_worker(self, k: int) -> None:
        while not self.stop and k < self.closed:
            if self.idle:
                conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = self.idle.popleft()
            else:
                conn, self.conns = None, self.conns + 1
            if not await self._one(time.monotonic(), conn):
                await asyncio.sleep(0.05)  # a refused connection must not spin

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        loop.create_task(self._commands(reader))
        since, counted = time.monotonic(), 0
        next_report = since + SECOND
        while not self.stop:
            now = time.monotonic()
            n = due(self.rate, since, now, counted)
            for _ in range(n):
                self._dispatch(now)
            counted += n
            if now >= next_report:
                self._report()
                next_report += SECOND
            await asyncio.sleep(TICK_S)
            if self._rate_changed:
                since, counted, self._rate_changed = time.monotonic(), 0, False

    _rate_changed = False

    async def _commands(self, reader: asyncio.StreamReader) -> None:
        while not self.stop:
            line = await reader.readline()
            if not line:
                self.stop = True
                return
            cmd = json.loads(line)
            if cmd.get("stop"):
                self.stop = True
            elif "rate" in cmd:
                self.rate, self.closed, self._rate_changed = float(cmd["rate"]), 0, True
            elif "closed" in cmd:
                self.rate, self._rate_changed = 0.0, True
                old, self.closed = self.closed, int(cmd["closed"])
                for k in range(old, self.closed):
                    asyncio.get_running_loop().create_task(self._closed_worker(k))

    def _report(self) -> None:
        s, self.stats = self.stats, Stats()
        line = {"t": round(time.monotonic(), 3), "rate": self.rate, "closed": self.closed, "sent": s.sent,
                "ok": s.ok, "failed": s.failed, "unsent": s.unsent, "p50_ms": percentile(s.latencies, 0.5),
                "p99_ms": percentile(s.latencies, 0.99), "in_flight": self.in_flight, "conns": self.conns}
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("url", help="the predict URL, e.g. http://127.0.0.1:8000/predict")
    ap.add_argument("bodies", help="a .npy file of rows (one row per request, sent in turn)")
    ap.add_argument("--max-connections", type=int, default=2048)
    ap.add_argument("--timeout-s", type=float, default=10.0)
    a = ap.parse_args(argv)
    import numpy as np
    import orjson

    rows = np.load(a.bodies).astype(np.float32)
    requests = [http_request(a.url, orjson.dumps({"inputs": [r.tolist()]})) for r in rows]
    gen = Generator(a.url, requests, a.max_connections, a.timeout_s)
    try:
        import uvloop

        uvloop.run(gen.run())
    except ImportError:
        asyncio.run(gen.run())


if __name__ == "__main__":
    main()
