"""The gateway's fast front (scanflow.serving.fastfront): the common POST /predict answered from the
HTTP protocol, everything else through the ASGI app, on a real socket.

A fake replica (uvicorn in a thread: /ready, /predict, /predict_batch echoing each body) stands behind a
real gateway served with the fast protocol in another thread; the gateway's ASGI `predict` is wrapped
to count which requests took the ASGI path.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import uvicorn
from serving_helpers import read_body

from scanflow.serving import batchwire
from scanflow.serving.fastfront import protocol_for
from scanflow.serving.gateway_server import GatewayConfig, create_app


async def _replica(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = await read_body(receive)
    ctype = b"application/json"
    if scope["path"] == "/predict_batch":
        items = batchwire.decode_request(body)
        out = batchwire.encode_response("7", [(200, orjson.dumps({"echo": b.decode()})) for b in items])
        ctype = batchwire.CONTENT_TYPE
    elif scope["path"] == "/predict":
        out = orjson.dumps({"echo": body.decode(), "alone": True})
    else:
        out = b'{"ready": true}'
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", ctype), (b"content-length", str(len(out)).encode())]})
    await send({"type": "http.response.body", "body": out})


def _serve(app: Any, **kw: Any) -> tuple[uvicorn.Server, threading.Thread, int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, loop="uvloop",
                                           log_level="warning", **kw))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.02)
    return server, thread, port


@pytest.fixture
def gateway(request: pytest.FixtureRequest) -> Iterator[tuple[int, Any, list[str]]]:
    """(port, Gateway, paths that took the ASGI path); `@pytest.mark.keep_alive(s)` sets uvicorn's
    keep-alive timeout (default 5 s)."""
    mark = request.node.get_closest_marker("keep_alive")
    keep_alive = mark.args[0] if mark else 5
    rep, rep_thread, rport = _serve(_replica, lifespan="off")
    app = create_app(GatewayConfig(replicas=(f"http://127.0.0.1:{rport}",), allow_anonymous=True,
                                   body_timeout_s=0.5, max_body_bytes=1 << 20))
    gw = app.gateway
    asgi_paths: list[str] = []
    plain_predict = gw.predict

    async def counted(scope: Any, receive: Any, send: Any) -> None:
        asgi_paths.append(scope["path"])
        await plain_predict(scope, receive, send)

    app.hot["/predict"] = counted
    server, thread, port = _serve(app, http=protocol_for(gw), lifespan="on", timeout_keep_alive=keep_alive)
    try:
        yield port, gw, asgi_paths
    finally:
        for s, t in ((server, thread), (rep, rep_thread)):
            s.should_exit = True
            t.join(10)


def _read(sock: socket.socket, buf: bytearray) -> tuple[bytes, dict[bytes, bytes], bytes]:
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        assert chunk, "connection closed before an answer"
        buf += chunk
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(b":", 1) for line in lines[1:])}
    length = int(headers[b"content-length"])
    while len(rest) < length:
        rest += sock.recv(65536)
    buf[:] = rest[length:]
    return lines[0], headers, rest[:length]


def _post(body: bytes, extra: bytes = b"") -> bytes:
    return b"POST /predict HTTP/1.1\r\nHost: x\r\n%bContent-Length: %d\r\n\r\n%b" % (extra, len(body), body)


def test_common_predict_skips_asgi_and_answers_like_it(gateway) -> None:  # type: ignore[no-untyped-def]
    port, gw, asgi_paths = gateway
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        buf = bytearray()
        c.sendall(_post(b'{"inputs": [[1]]}', b"Content-Type: application/json\r\n"))
        status, headers, body = _read(c, buf)
        assert status == b"HTTP/1.1 200 OK"
        assert orjson.loads(body) == {"echo": '{"inputs": [[1]]}'}
        assert headers[b"content-type"] == b"application/json"
        assert headers[b"x-scanflow-upstream"] == gw.replicas[0].url.encode()
        assert b"date" in headers
        assert asgi_paths == []  # answered by the protocol, not the ASGI app
        assert gw.counts["coalesced_requests"] == 1
        # the same connection keeps working, and chunked bodies take the ASGI path with the same answer
        c.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n3\r\n\":1\r\n1\r\n}\r\n0\r\n\r\n")
        status, headers, body = _read(c, buf)
        assert status == b"HTTP/1.1 200 OK" and orjson.loads(body) == {"echo": '{"a":1}'}
        assert headers[b"x-scanflow-upstream"] == gw.replicas[0].url.encode()
        assert asgi_paths == ["/predict"]


def test_pipelined_requests_are_answered_in_order(gateway) -> None:  # type: ignore[no-untyped-def]
    port, _, asgi_paths = gateway
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        buf = bytearray()
        c.sendall(_post(b'{"n": 1}') + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" + _post(b'{"n": 3}'))
        assert orjson.loads(_read(c, buf)[2]) == {"echo": '{"n": 1}'}
        assert orjson.loads(_read(c, buf)[2])["status"] == "alive"
        assert orjson.loads(_read(c, buf)[2]) == {"echo": '{"n": 3}'}
        c.sendall(_post(b'{"n": 4}', b"Connection: close\r\n"))
        _status, headers, body = _read(c, buf)
        assert orjson.loads(body) == {"echo": '{"n": 4}'} and headers[b"connection"] == b"close"
        assert c.recv(10) == b""  # closed after the answer
    assert asgi_paths.count("/predict") <= 1  # the third may queue behind /health's ASGI cycle


def test_bad_requests_keep_their_4xx(gateway) -> None:  # type: ignore[no-untyped-def]
    port, _, _ = gateway
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        buf = bytearray()
        c.sendall(_post(b"hello", b"Content-Type: text/plain\r\n"))
        status, _, body = _read(c, buf)
        assert status.startswith(b"HTTP/1.1 415") and b"not JSON" in body
        c.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (2 << 20))
        status, _, _ = _read(c, buf)
        assert status.startswith(b"HTTP/1.1 413")


def test_a_slow_body_gets_408_and_the_connection_closes(gateway) -> None:  # type: ignore[no-untyped-def]
    port, gw, _ = gateway
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        c.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n{\"inp")
        t0 = time.monotonic()
        status, headers, body = _read(c, bytearray())
        assert status.startswith(b"HTTP/1.1 408") and headers[b"connection"] == b"close"
        assert b"not received within 0.5 s" in body
        assert time.monotonic() - t0 >= 0.4
        assert c.recv(10) == b""
    assert gw.counts["coalesced_requests"] == 0  # nothing was forwarded


def test_front_flag_and_its_env_default(monkeypatch: pytest.MonkeyPatch) -> None:
    from scanflow.serving.gateway import parse_args

    monkeypatch.delenv("SCANFLOW_GATEWAY_FRONT", raising=False)
    assert parse_args(["--port", "1"]).front == "fast"
    for env, argv, front in (("fast", [], "fast"), ("asgi", [], "asgi"), ("asgi", ["--front", "fast"], "fast"),
                             ("fast", ["--front", "asgi"], "asgi")):
        monkeypatch.setenv("SCANFLOW_GATEWAY_FRONT", env)
        assert parse_args(["--port", "1", *argv]).front == front
    monkeypatch.setenv("SCANFLOW_GATEWAY_FRONT", "turbo")
    with pytest.raises(SystemExit):
        parse_args(["--port", "1"])


def test_the_asgi_scope_is_the_one_uvicorn_builds() -> None:
    """The fast front builds the ASGI scope only for requests that take the ASGI path; what it builds
    must be what uvicorn's own on_message_begin would have (a new uvicorn changing it fails here)."""
    import asyncio

    from uvicorn.config import Config
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    from uvicorn.server import ServerState

    app = create_app(GatewayConfig(replicas=("http://127.0.0.1:9",)))
    config = Config(app=app, loop="asyncio", root_path="/under")
    loop = asyncio.new_event_loop()
    try:
        proto = protocol_for(app.gateway)(config=config, server_state=ServerState(), app_state={"k": [1]},
                                          _loop=loop)
        proto.server, proto.client, proto.scheme = ("127.0.0.1", 8000), ("127.0.0.1", 5555), "http"
        HttpToolsProtocol.on_message_begin(proto)
        expected = proto.scope
        proto.on_message_begin()
        proto._asgi_scope()
        assert proto.scope == expected
        assert proto.scope["headers"] is proto.headers  # headers read after the scope was made land in it
        assert proto.scope["state"] is not expected["state"]  # a fresh copy of the app state per request
    finally:
        loop.close()


@pytest.mark.keep_alive(2)
def test_keep_alive_closes_idle_connections_and_spares_busy_ones(gateway) -> None:  # type: ignore[no-untyped-def]
    """One lazy keep-alive timer per connection (not one per answer): a connection idle past the timeout
    is closed; one that keeps sending, at intervals shorter than the timeout, for longer than it, is not."""
    port, _, asgi_paths = gateway
    with socket.create_connection(("127.0.0.1", port), timeout=10) as busy, \
            socket.create_connection(("127.0.0.1", port), timeout=10) as idle:
        buf_busy, buf_idle = bytearray(), bytearray()
        idle.sendall(_post(b'{"n": 0}'))
        assert orjson.loads(_read(idle, buf_idle)[2]) == {"echo": '{"n": 0}'}
        t0 = time.monotonic()
        n = 0
        while time.monotonic() - t0 < 3.0:  # 1.5 timeouts of traffic, a request every ~0.1 s
            n += 1
            busy.sendall(_post(b'{"n": %d}' % n))
            assert orjson.loads(_read(busy, buf_busy)[2]) == {"echo": f'{{"n": {n}}}'}
            time.sleep(0.1)
        idle.settimeout(5)
        assert idle.recv(10) == b""  # closed by the server (idle for 1.5 timeouts and more)
        busy.sendall(_post(b'{"n": -1}'))
        assert orjson.loads(_read(busy, buf_busy)[2]) == {"echo": '{"n": -1}'}
    assert asgi_paths == []
