"""The corked transport (scanflow.serving.corked): the writes of one loop turn leave as one writelines,
in order, and nothing queued is lost on close. Plus a real uvicorn server on it answering pipelined
and keep-alive requests over a raw socket."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import uvicorn
from serving_helpers import read_body

from scanflow.serving.corked import FLUSH_BYTES, CorkedHttpToolsProtocol, CorkedTransport


class _FakeTransport:
    def __init__(self) -> None:
        self.sent: list[list[bytes]] = []
        self.closed = False

    def writelines(self, chunks: list[bytes]) -> None:
        self.sent.append(list(chunks))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_write_buffer_size(self) -> int:
        return 0


async def test_writes_of_one_turn_leave_together_in_order() -> None:
    fake = _FakeTransport()
    t = CorkedTransport(fake, asyncio.get_running_loop())  # type: ignore[arg-type]
    t.write(b"HTTP/1.1 200 OK\r\n\r\n")
    t.write(b"body")
    assert fake.sent == [] and t.get_write_buffer_size() == 23
    await asyncio.sleep(0)
    assert fake.sent == [[b"HTTP/1.1 200 OK\r\n\r\n", b"body"]]
    t.write(b"next")
    t.close()  # what is queued goes out before the close
    assert fake.sent[-1] == [b"next"] and fake.closed
    t.write(b"late")
    await asyncio.sleep(0)
    assert len(fake.sent) == 2  # nothing written on a closed transport


async def test_a_large_queue_goes_out_at_once() -> None:
    """Past FLUSH_BYTES the queue is sent in the same turn, so the real transport's flow control sees it."""
    fake = _FakeTransport()
    t = CorkedTransport(fake, asyncio.get_running_loop())  # type: ignore[arg-type]
    t.write(b"h")
    t.write(b"x" * FLUSH_BYTES)
    assert fake.sent == [[b"h", b"x" * FLUSH_BYTES]] and t.get_write_buffer_size() == 0
    await asyncio.sleep(0)
    assert len(fake.sent) == 1  # the scheduled flush finds nothing left to send


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = await read_body(receive)
    out = body[::-1] or b"x" * 300_000  # an empty request gets a large answer (several socket writes)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(out)).encode())]})
    await send({"type": "http.response.body", "body": out})


def _read_answer(sock: socket.socket, buf: bytearray) -> bytes:
    while b"\r\n\r\n" not in buf:
        buf += sock.recv(65536)
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    while len(rest) < length:
        rest += sock.recv(65536)
    buf[:] = rest[length:]
    return rest[:length]


def test_real_server_answers_pipelined_keepalive_and_large_bodies() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(_app, host="127.0.0.1", port=port, http=CorkedHttpToolsProtocol,
                                           loop="uvloop", lifespan="off", log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
            time.sleep(0.02)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
            req = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%b"
            c.sendall(req % (3, b"abc") + req % (4, b"wxyz"))  # two requests in one segment
            buf = bytearray()
            assert _read_answer(c, buf) == b"cba"
            assert _read_answer(c, buf) == b"zyxw"
            c.sendall(req % (0, b""))
            assert _read_answer(c, buf) == b"x" * 300_000
            c.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok")
            assert _read_answer(c, buf) == b"ko"
            assert c.recv(10) == b""  # closed after the answer went out
    finally:
        server.should_exit = True
        thread.join(10)
