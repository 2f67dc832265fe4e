"""The gateway's lean upstream client against real loopback sockets (asyncio servers in-process)."""

from __future__ import annotations

import asyncio
import socket

import pytest
from serving_helpers import free_port

from scanflow.serving.upstream import UpstreamError, UpstreamPool


async def _server(handler):  # type: ignore[no-untyped-def]
    return await asyncio.start_server(handler, "127.0.0.1", 0)


def _answer(body: bytes, keep_alive: bool = True) -> bytes:
    conn = b"" if keep_alive else b"Connection: close\r\n"
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + conn + (
        f"Content-Length: {len(body)}\r\n\r\n".encode() + body
    )


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(next(x for x in head.split(b"\r\n") if x.lower().startswith(b"content-length")).split(b":")[1])
    return await reader.readexactly(length)


async def test_reuses_a_connection_and_sets_nodelay() -> None:
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        try:
            while True:
                body = await _read_request(reader)
                writer.write(_answer(b'{"echo": ' + body + b"}"))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await _server(handler)
    pool = UpstreamPool(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
    try:
        for i in range(3):
            status, body, ctype = await pool.post(b"/predict", str(i).encode(), 5)
            assert (status, body, ctype) == (200, b'{"echo": ' + str(i).encode() + b"}", b"application/json")
        conn = pool._idle[0]
        sock = conn.transport.get_extra_info("socket")  # type: ignore[union-attr]
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        pool.close()
        server.close()
    assert connections == 1


async def test_stale_keepalive_connection_is_replaced_not_reported() -> None:
    """The server closes idle connections (keep-alive timeout): the next request opens a new one."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(_answer(b"{}"))  # claims keep-alive, then closes anyway
        await writer.drain()
        writer.close()

    server = await _server(handler)
    pool = UpstreamPool(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
    try:
        assert (await pool.post(b"/predict", b"{}", 5))[0] == 200
        await asyncio.sleep(0.05)  # let the close arrive
        assert (await pool.post(b"/predict", b"{}", 5))[0] == 200
    finally:
        pool.close()
        server.close()


async def test_refused_and_mid_answer_close_raise_upstream_error() -> None:
    with pytest.raises(UpstreamError, match="cannot connect"):
        await UpstreamPool(f"http://127.0.0.1:{free_port()}").post(b"/predict", b"{}", 5)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{")  # then dies
        await writer.drain()
        writer.close()

    server = await _server(handler)
    pool = UpstreamPool(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
    try:
        with pytest.raises(UpstreamError, match="closed"):
            await pool.post(b"/predict", b"{}", 5)
    finally:
        server.close()


def test_only_http_urls() -> None:
    with pytest.raises(ValueError, match="only http"):
        UpstreamPool("https://example.org")
