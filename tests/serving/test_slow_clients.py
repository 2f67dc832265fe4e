"""Slow clients against every server Scanflow runs, as real processes on loopback: a request head that
never completes (slowloris: a partial head, then one byte at a time), a connection that sends nothing,
and an agent's slow body are cut within their deadlines (scanflow.httpdeadline, the agents'
BodySizeLimit), while an ordinary client on another connection keeps being served.

Without the head deadline uvicorn keeps such a connection open for as long as bytes keep coming (its
keep-alive timer is cancelled by any received byte, and a fresh connection has no timer at all).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Self
from urllib.parse import urlsplit

import httpx
import pytest
from serving_helpers import Proc, free_port

pytestmark = [pytest.mark.integration]

HEAD_S = 1.0  # the head deadline the servers run with here
GIVE_UP_S = 30.0  # a probe that is not cut by then never would be
AGENTS = Path(__file__).resolve().parents[1] / "agent" / "sample_agents.py"


def _connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    return socket.create_connection((parts.hostname, parts.port), timeout=5)


def _probe(sock: socket.socket, first: bytes, drip: bytes | None, every_s: float = 0.1) -> tuple[float, bytes]:
    """Send `first`, then `drip` every `every_s` (None: nothing more) until the server closes the
    connection; (seconds from `first` to the close, everything the server sent). GIVE_UP_S at most."""
    answer = b""
    t0 = time.monotonic()
    if first:
        sock.sendall(first)
    sock.settimeout(every_s)
    while time.monotonic() - t0 < GIVE_UP_S:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            if drip is not None:
                try:
                    sock.sendall(drip)
                except OSError:  # closed under us: read what was answered
                    drip = None
            continue
        except ConnectionResetError:
            break
        if not chunk:
            break
        answer += chunk
    sock.close()
    return time.monotonic() - t0, answer


class Ordinary:
    """A client on its own connections: GET `path` in a loop while a probe runs; every answer must be
    200, and the slowest one tells how late the machine runs timers."""

    def __init__(self, url: str) -> None:
        self.url, self.stop = url, threading.Event()
        self.statuses: list[int] = []
        self.worst_s = 0.0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self.stop.is_set():
                t0 = time.monotonic()
                self.statuses.append(client.get(self.url).status_code)
                self.worst_s = max(self.worst_s, time.monotonic() - t0)
                self.stop.wait(0.05)

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=60)


def _assert_cut_in_time(took_s: float, answer: bytes, ordinary: Ordinary, deadline_s: float, what: str) -> None:
    slack = 2.0 + 5 * ordinary.worst_s  # a busy machine fires timers late; never the GIVE_UP_S of an uncut one
    assert took_s < deadline_s + slack, f"{what}: held {took_s:.1f} s (deadline {deadline_s} s)"
    assert took_s >= deadline_s * 0.9, f"{what}: cut after {took_s:.2f} s, before its deadline of {deadline_s} s"
    assert len(ordinary.statuses) >= 3 and set(ordinary.statuses) == {200}, ordinary.statuses


def _slowloris(url: str, head: bytes, health: str = "/health") -> None:
    """A partial head then a byte at a time: 408 and closed within the deadline; others served."""
    with Ordinary(url + health) as ordinary:
        took, answer = _probe(_connect(url), head + b"X-Slow: ", b"a")
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"connection: close" in answer.lower() and b"request head not received within 1 s" in answer
    _assert_cut_in_time(took, answer, ordinary, HEAD_S, f"slow head to {url}")


@pytest.mark.parametrize("front", ["asgi", "fast"])
def test_gateway_cuts_slow_heads_and_silent_connections(launch, front: str) -> None:  # type: ignore[no-untyped-def]
    # no replica behind it: /health answers all the same, and no head here ever completes
    gw = launch("gateway", "--replica", f"http://127.0.0.1:{free_port()}", "--allow-anonymous",
                "--front", front, "--head-timeout-s", str(HEAD_S))
    _slowloris(gw.url, b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")

    with Ordinary(gw.url + "/health") as ordinary:  # connects, sends nothing: closed, nothing said
        took, answer = _probe(_connect(gw.url), b"", None)
    assert answer == b""
    _assert_cut_in_time(took, answer, ordinary, HEAD_S, "a silent connection")

    # a kept-alive connection: its first request is answered; a slow second head is cut like any other
    sock = _connect(gw.url)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    first = sock.recv(65536)
    assert first.startswith(b"HTTP/1.1 200"), first[:200]
    with Ordinary(gw.url + "/health") as ordinary:
        took, answer = _probe(sock, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ", b"a")
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    _assert_cut_in_time(took, answer, ordinary, HEAD_S, "a slow second head")


def test_replica_cuts_slow_heads(digits_models, launch) -> None:  # type: ignore[no-untyped-def]
    r = launch("replica", "--model-uri", digits_models["v1"], "--allow-anonymous", "--head-timeout-s", str(HEAD_S))
    _slowloris(r.url, b"POST /predict HTTP/1.1\r\nHost: x\r\n")


def test_head_timeout_from_the_environment(launch) -> None:  # type: ignore[no-untyped-def]
    gw = launch("gateway", "--replica", f"http://127.0.0.1:{free_port()}", "--allow-anonymous",
                env={"SCANFLOW_HEAD_TIMEOUT_S": str(HEAD_S)})
    _slowloris(gw.url, b"GET /health HTTP/1.1\r\nHost: x\r\n")


@pytest.fixture
def agent(tmp_path: Path):  # type: ignore[no-untyped-def]
    """`scanflow agent run` (a sample agent) with 1 s head and body deadlines."""
    port = free_port()
    env = {**os.environ, "SCANFLOW_HOME": str(tmp_path), "SCANFLOW_TOKEN": "slow-clients-token",
           "SCANFLOW_HEAD_TIMEOUT_S": str(HEAD_S), "SCANFLOW_BODY_TIMEOUT_S": str(HEAD_S),
           "SCANFLOW_TEST_OUT": str(tmp_path), "SCANFLOW_LOG_LEVEL": "WARNING"}
    log = tmp_path / "agent.log"
    with open(log, "wb") as fh:
        popen = subprocess.Popen([sys.executable, "-m", "scanflow.cli", "agent", "run", str(AGENTS), "--name",
                                  "worker", "--port", str(port)], env=env, stdout=fh, stderr=subprocess.STDOUT)
    proc = Proc(popen, f"http://127.0.0.1:{port}", log)
    try:
        proc.wait_ready("/health")
        yield proc
    finally:
        proc.stop()


def test_agent_cuts_slow_heads_and_slow_bodies(agent: Proc) -> None:
    _slowloris(agent.url, b"POST /events HTTP/1.1\r\nHost: x\r\n")

    # a complete head, then a body that never arrives in full: 408 and closed within the body deadline
    head = (b"POST /events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer slow-clients-token\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
    with Ordinary(agent.url + "/health") as ordinary:
        took, answer = _probe(_connect(agent.url), head + b'{"name": ', b" ", every_s=0.2)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"connection: close" in answer.lower() and b"request body not received within 1 s" in answer
    _assert_cut_in_time(took, answer, ordinary, HEAD_S, "a slow body to the agent")
    # a whole body in time is served as before
    ok = httpx.post(agent.url + "/events", json={"name": "noise"},
                    headers={"Authorization": "Bearer slow-clients-token"})
    assert ok.status_code == 202, ok.text
