"""A lean HTTP/1.1 keep-alive client for the gateway's forwarding path.

Who calls: scanflow.serving.gateway, once per forwarded request. Why not aiohttp/httpx there: a
general client spends ~150-250 us of Python per request (request objects, header multidicts, timers),
which on a small machine is most of the gateway's budget. This one writes pre-built bytes on a pooled
connection (TCP_NODELAY) and parses the answer with httptools (uvicorn's C parser): one POST shape,
Content-Length bodies, nothing else. Health checks and admin traffic keep using aiohttp.
"""

from __future__ import annotations

import asyncio
import collections
import socket
from urllib.parse import urlsplit

import httptools


class UpstreamError(Exception):
    """The upstream could not answer (refused, reset, closed mid-answer): the request may be retried."""


class _Conn(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[tuple[int, bytes, bytes]] | None = None
        self.closed = False
        self._body: list[bytes] = []
        self._ctype = b"application/json"
        self._got_bytes = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self._got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamError(f"bad HTTP answer from upstream: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(UpstreamError(f"connection closed by upstream{': ' + str(exc) if exc else ''}"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"content-type":
            self._ctype = value

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        status = self.parser.get_status_code()
        if not self.parser.should_keep_alive():
            self.close()
        body = b"".join(self._body)
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result((status, body, self._ctype))

    # ours
    def _fail(self, exc: Exception) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def send(self, data: bytes) -> asyncio.Future[tuple[int, bytes, bytes]]:
        self._body = []
        self._ctype = b"application/json"
        self._got_bytes = False
        self.waiter = asyncio.get_running_loop().create_future()
        assert self.transport is not None
        self.transport.write(data)
        return self.waiter


class UpstreamPool:
    """Keep-alive connections to one upstream base URL (http only)."""

    def __init__(self, base_url: str, *, max_idle: int = 256, connect_timeout_s: float = 2.0) -> None:
        u = urlsplit(base_url)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"upstream {base_url!r}: only http://host:port is supported on this path")
        self.host = u.hostname
        self.port = u.port or 80
        self._host_header = f"{self.host}:{self.port}".encode()
        self._idle: collections.deque[_Conn] = collections.deque()
        self.max_idle = max_idle
        self.connect_timeout_s = connect_timeout_s
        self.closed = False

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(_Conn, self.host, self.port)
        except (OSError, TimeoutError) as exc:
            raise UpstreamError(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        return conn

    def _request_bytes(self, path: bytes, body: bytes, ctype: bytes = b"application/json") -> bytes:
        return b"".join((
            b"POST ", path, b" HTTP/1.1\r\nHost: ", self._host_header,
            b"\r\nContent-Type: ", ctype, b"\r\nContent-Length: ", str(len(body)).encode(),
            b"\r\n\r\n", body,
        ))  # fmt: skip

    async def post(
        self, path: bytes, body: bytes, timeout_s: float, ctype: bytes = b"application/json"
    ) -> tuple[int, bytes, bytes]:
        """(status, body, content-type). UpstreamError when it could not answer; TimeoutError on timeout."""
        data = self._request_bytes(path, body, ctype)
        while self._idle:
            conn = self._idle.pop()
            if conn.closed:
                continue
            try:
                result = await self._roundtrip(conn, data, timeout_s)
            except UpstreamError:
                if conn._got_bytes:
                    raise
                continue  # a stale keep-alive connection closed by the server: try another / a new one
            return result
        return await self._roundtrip(await self._connect(), data, timeout_s)

    async def _roundtrip(self, conn: _Conn, data: bytes, timeout_s: float) -> tuple[int, bytes, bytes]:
        try:
            async with asyncio.timeout(timeout_s):
                result = await conn.send(data)
        except BaseException:
            conn.close()  # state unknown (timeout, cancel): never reuse
            raise
        if not conn.closed and not self.closed and len(self._idle) < self.max_idle:
            self._idle.append(conn)
        else:
            conn.close()
        return result

    def close(self) -> None:
        """Close idle connections now; busy ones close when their request ends."""
        self.closed = True
        while self._idle:
            self._idle.pop().close()
