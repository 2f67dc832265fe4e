"""Ports reserved by the process that picks them and handed to the server that listens on them
(scanflow.platform.processes.reserve_port / spawn(listener=), scanflow.handoff).

Why: CI lost an agent whose port, picked free before the bootstrap, was taken by another stack's
server before the agent bound it, and kept through every restart. These tests use real sockets and a
real child process serving with uvicorn on the handed socket.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from scanflow.handoff import (
    LISTEN_FD_ENV,
    RESERVED_PORTS_ENV,
    HandoffError,
    reserved_ports_value,
    take_listen_socket,
    take_reserved_ports,
)
from scanflow.platform import processes as procs

REPO = Path(__file__).resolve().parents[2]


def _bind(port: int, reuse: bool) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        if reuse:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


def _refused(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as c:
        return c.connect_ex(("127.0.0.1", port)) == errno.ECONNREFUSED


@pytest.mark.parametrize("reuse", [False, True], ids=["plain bind", "SO_REUSEADDR bind"])
def test_a_reserved_port_cannot_be_bound_by_anyone_else(reuse: bool) -> None:
    with procs.reserve_port() as held:
        port = held.getsockname()[1]
        with pytest.raises(OSError) as err:
            _bind(port, reuse)  # uvicorn sets SO_REUSEADDR: another stack's server must fail too
        assert err.value.errno == errno.EADDRINUSE


def test_a_connection_made_before_the_server_starts_waits_for_it() -> None:
    with procs.reserve_port() as held, socket.create_connection(held.getsockname()[:2], timeout=5.0):
        conn, _ = held.accept()  # what the server does once it has the socket: the caller was queued
        conn.close()


def test_a_fixed_port_is_reserved_again_past_its_last_holders_time_wait() -> None:
    """A restarted agent or gateway keeps its port: the connections its previous process closed first
    (TIME_WAIT, a minute on Linux) must not keep it from the next one."""
    with procs.reserve_port() as first:
        port = first.getsockname()[1]
        first.listen()
        with socket.create_connection(("127.0.0.1", port)) as client:
            conn, _ = first.accept()
            conn.close()  # the server side closes first: its end waits in TIME_WAIT
            client.recv(1)
    with pytest.raises(OSError):  # the premise: a bind without SO_REUSEADDR fails now
        _bind(port, reuse=False)
    with procs.reserve_port(port=port) as again:
        assert again.getsockname()[1] == port


def test_a_fixed_port_someone_else_holds_is_a_clear_error() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(procs.PortInUse, match=rf"port {port} on 127.0.0.1 is in use"):
            procs.reserve_port(port=port)


CHILD = textwrap.dedent("""
    import os, sys
    from scanflow.handoff import LISTEN_FD_ENV, serve_uvicorn

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        body = repr(os.environ.get(LISTEN_FD_ENV)).encode()  # None: the child does not pass it on
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    serve_uvicorn(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", lifespan="off")
""")


def _get_when_up(url: str, proc: procs.subprocess.Popen[bytes], log: Path, timeout_s: float) -> httpx.Response:
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            return httpx.get(url, timeout=5.0)
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.05)  # poll interval while the child imports uvicorn, not a synchronisation


def test_a_child_serves_on_the_handed_socket_and_the_port_is_free_once_it_exits(tmp_path: Path) -> None:
    listener = procs.reserve_port()
    port = listener.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    log = tmp_path / "child.log"
    proc = procs.spawn([sys.executable, "-c", CHILD, str(port)], log, env, listener=listener)
    try:
        assert listener.fileno() == -1  # the parent's copy is closed: the port is the child's
        r = _get_when_up(f"http://127.0.0.1:{port}/", proc, log, timeout_s=120.0)
        assert r.status_code == 200 and r.text == "None", r.text
    finally:
        procs.stop(proc, 10.0)
    assert _refused(port)  # no copy left anywhere that would queue connections for a dead server
    _bind(port, reuse=True)  # and it can be taken again


def test_a_socket_handed_for_another_port_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with procs.reserve_port() as held:
        monkeypatch.setenv(LISTEN_FD_ENV, str(os.dup(held.fileno())))  # as a child gets it: its own descriptor
        with pytest.raises(HandoffError, match="not 127.0.0.1:1"):
            take_listen_socket("127.0.0.1", 1)
        assert LISTEN_FD_ENV not in os.environ  # read once: a grandchild never sees it


def test_a_descriptor_that_is_no_socket_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    r, w = os.pipe()
    try:
        monkeypatch.setenv(LISTEN_FD_ENV, str(r))
        with pytest.raises(HandoffError, match="not an open socket"):
            take_listen_socket("127.0.0.1", 8080)
        monkeypatch.setenv(LISTEN_FD_ENV, "seven")
        with pytest.raises(HandoffError, match="not an open socket"):
            take_listen_socket("127.0.0.1", 8080)
    finally:
        os.close(r)
        os.close(w)


def test_no_handed_socket_means_bind_as_usual(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LISTEN_FD_ENV, raising=False)
    assert take_listen_socket("127.0.0.1", 8080) is None


def test_reserved_ports_are_handed_on_by_port(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = procs.reserve_port(), procs.reserve_port()
    monkeypatch.setenv(RESERVED_PORTS_ENV, reserved_ports_value([a, b]))
    got = take_reserved_ports()
    try:
        assert sorted(got) == sorted([a.getsockname()[1], b.getsockname()[1]])
        assert RESERVED_PORTS_ENV not in os.environ
    finally:
        for s in [a, b]:
            s.detach()  # the same descriptors as in `got`: closed once, below
        for s in got.values():
            s.close()
