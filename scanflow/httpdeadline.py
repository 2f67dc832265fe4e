"""A deadline on the request head: uvicorn's httptools protocol that cuts a client whose request line
and headers do not arrive in full within `head_timeout_s`.

Why: uvicorn (0.54) has no such bound. A fresh connection arms no timer at all, and its keep-alive
timer is cancelled by any received byte, so a client that sends a partial head and then one byte every
few seconds (slowloris) holds a connection, its buffers and a slot of the server for as long as it
likes; a few hundred such clients starve the server. Body deadlines (scanflow.serving.asgi.BodyDeadlines,
the agents' BodySizeLimit, scanflow/agent/bodylimit.py) only start once the head is complete.

How: one timer per head that did not arrive in a single read. A timer is armed when the connection is
made (a client that connects and sends nothing is closed after the deadline) and, after a read, when a
request head has begun but is not complete; it is cancelled when the headers complete. A request whose
head arrives in one read (nearly all of them) costs two attribute writes, no timer. When the timer
fires: 408 and close if part of a head was received, a plain close if nothing was; a request still
being answered on the same connection (pipelining) is finished first and the connection then closed.
The deadline counts from the first read of the head, not from each byte, so dripping bytes does not
extend it.

Who uses it: every server Scanflow runs: the agents (scanflow.agent.serve), the replica and the gateway
(scanflow.serving.server.run_server, through scanflow.serving.corked and scanflow.serving.fastfront,
whose fast path calls `head_complete` itself) and the MLflow proxy (scanflow.tracking.mlflow_proxy).
It relies on uvicorn's httptools protocol keeping `loop`, `transport`, `cycle` and the parser
callbacks `on_message_begin` / `on_headers_complete`, pinned by the project's uvicorn version and
exercised by tests/serving/test_head_deadline.py and tests/agent/test_agent_deadlines.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

DEFAULT_HEAD_TIMEOUT_S = 10.0
_408 = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"content-length: %d\r\n\r\n")


class HeadDeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline on each request head (see the module's doc).
    `head_timeout_s` is a class attribute: bind it with `with_head_timeout`."""

    head_timeout_s: float = DEFAULT_HEAD_TIMEOUT_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_pending = False  # on_message_begin seen, on_headers_complete not yet

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_expired)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._head_pending and self._head_timer is None and not self.transport.is_closing():
            self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_expired)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_pending = True

    def on_headers_complete(self) -> None:
        self.head_complete()
        super().on_headers_complete()

    def head_complete(self) -> None:
        """The current request's head is in: no deadline until the next one begins."""
        self._head_pending = False
        self._cancel_head_timer()

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_expired(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:  # answer the request in hand, then close
            cycle.keep_alive = False
            return
        if self._head_pending:
            detail = b'{"detail":"request head not received within %g s"}' % self.head_timeout_s
            self.transport.write(_408 % len(detail) + detail)
        self.transport.close()


def with_head_timeout(cls: type[HeadDeadlineProtocol], head_timeout_s: float) -> type[HeadDeadlineProtocol]:
    """`cls` with its head deadline set to `head_timeout_s` (> 0): the class uvicorn instantiates per
    connection (`uvicorn.Config(http=...)`)."""
    if not head_timeout_s > 0:
        raise ValueError(f"head timeout must be > 0 s, got {head_timeout_s!r}")
    return type(cls.__name__, (cls,), {"head_timeout_s": float(head_timeout_s)})
