"""The open-loop generator (scanflow.demo.openload): its pure parts, and one real run against a tiny
HTTP server on loopback, steered over stdin through `OpenLoad` (a real child process)."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from scanflow.demo.common import wait_for
from scanflow.demo.load import OpenLoad
from scanflow.demo.openload import due, http_request, parse_head, percentile


def test_due_spreads_a_rate_evenly_and_never_goes_negative() -> None:
    assert due(100.0, 0.0, 0.5, 0) == 50
    assert due(100.0, 0.0, 0.5, 48) == 2
    assert due(100.0, 0.0, 0.5, 60) == 0
    assert due(0.0, 0.0, 10.0, 0) == 0


def test_request_and_response_heads() -> None:
    raw = http_request("http://127.0.0.1:8000/predict", b'{"inputs": [[1]]}')
    assert raw.startswith(b"POST /predict HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n")
    assert raw.endswith(b"Content-Length: 17\r\n\r\n" + b'{"inputs": [[1]]}')
    assert parse_head(b"HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\n") == (200, 12)
    assert parse_head(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n") == (503, 0)
    with pytest.raises(ValueError):
        parse_head(b"garbage\r\n\r\n")
    assert percentile([], 0.99) is None and percentile([5.0, 1.0, 3.0], 0.5) == 3.0


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.answered += 1  # type: ignore[attr-defined]
        body = b'{"outputs": [1]}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return None


def test_open_load_sends_the_rate_it_is_told_and_reports_each_second(tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.answered = 0  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        with OpenLoad(url, np.zeros((4, 64), dtype=np.float32), tmp_path) as load:
            load.rate(40.0)
            assert wait_for(lambda: sum(s.ok for s in load.seconds()) >= 60, 30.0)
            load.rate(0.0)
            t_idle = time.monotonic() + 1.5
            assert wait_for(lambda: any(s.t > t_idle for s in load.seconds()), 10.0)
            got = load.seconds()
        busy = [s for s in got if s.rate == 40.0 and s.sent]
        assert busy and all(s.failed == 0 and s.unsent == 0 for s in got)
        # open loop at 40/s: the answers per second (counted when they come) average the rate, no burst
        assert 30.0 <= sum(s.sent for s in busy) / len(busy) <= 42.0, busy
        assert [s for s in got if s.t > t_idle][-1].sent == 0  # rate 0: idle
        assert server.answered == sum(s.ok for s in got)  # type: ignore[attr-defined]
    finally:
        server.shutdown()
