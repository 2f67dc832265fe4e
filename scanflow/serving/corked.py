"""One socket write per answer: a uvicorn HTTP protocol whose writes in one loop turn leave together.

Why: uvicorn (0.54, httptools) writes an answer as two `transport.write` calls, the status line and
headers on `http.response.start`, then the body on `http.response.body`, and uvloop sends each at
once: two `send` syscalls and two TCP segments per answer, which the receiver also pays for. Measured
on the gateway under wrk (64 clients, docs/serving.md): CPU per request 121 -> 100 us for the gateway,
75 -> 56 us for an empty endpoint. Here the transport is wrapped so that the writes made during one
loop turn are queued (no copy: the list holds the caller's bytes) and handed to the real transport
as one `writelines` (one `writev`) at the end of that turn. `close()` sends what is queued first;
more than `FLUSH_BYTES` queued goes out at once, so a large or streamed answer still meets the real
transport's flow control (pause_writing) as it would without the proxy.

Who uses it: scanflow.serving.server.run_server (`http=CorkedHttpToolsProtocol`), so the gateway,
the replicas and the benchmark's empty endpoint all run on it. It relies on uvicorn's protocol
keeping its transport in `self.transport` and its loop in `self.loop`; tests/serving exercise it
(keep-alive, pipelining, connection close, large bodies) on every run.
"""

from __future__ import annotations

import asyncio
from typing import Any

from scanflow.httpdeadline import HeadDeadlineProtocol

FLUSH_BYTES = 64 * 1024


class CorkedTransport:
    """Transport proxy: `write` queues; the queue leaves as one `writelines` after this loop turn."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._queued: list[bytes] = []
        self._queued_bytes = 0

    def write(self, data: bytes) -> None:
        if not data:
            return
        if not self._queued:
            self._loop.call_soon(self.flush)
        self._queued.append(data)
        self._queued_bytes += len(data)
        if self._queued_bytes > FLUSH_BYTES:
            self.flush()

    def write_now(self, data: bytes) -> None:
        """Write at once when nothing is queued (an answer that is already one buffer needs no corking);
        behind queued data it queues too, so bytes never leave out of order."""
        if self._queued:
            self.write(data)
        else:
            self._transport.write(data)

    def writelines(self, chunks: list[bytes]) -> None:
        for chunk in chunks:
            self.write(chunk)

    def flush(self) -> None:
        queued, self._queued = self._queued, []
        self._queued_bytes = 0
        if queued and not self._transport.is_closing():
            self._transport.writelines(queued)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + self._queued_bytes

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:  # everything else (is_closing, pause_reading, ...) as is
        return getattr(self._transport, name)


class CorkedHttpToolsProtocol(HeadDeadlineProtocol):
    """uvicorn's httptools protocol on a `CorkedTransport`, with a deadline on request heads
    (scanflow.httpdeadline)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.transport = CorkedTransport(transport, self.loop)  # type: ignore[assignment]
