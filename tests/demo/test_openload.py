"""The load generator's child-process host (`python -m scanflow.loadgen`, steered through `OpenLoad`):
one real run against a tiny HTTP server on loopback, a real child process."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np

from scanflow.demo.common import wait_for
from scanflow.demo.load import OpenLoad


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
            load.closed(2)
            t_closed = time.monotonic() + 1.5
            assert wait_for(lambda: any(s.t > t_closed and s.closed == 2 for s in load.seconds()), 10.0)
            load.rate(0.0)
            t_idle = time.monotonic() + 1.5
            assert wait_for(lambda: any(s.t > t_idle for s in load.seconds()), 10.0)
            got = load.seconds()
        busy = [s for s in got if s.rate == 40.0 and s.sent]
        assert busy and all(s.failed == 0 and s.unsent == 0 for s in got)
        # open loop at 40/s: the answers per second (counted when they come) average the rate, no burst
        assert 30.0 <= sum(s.sent for s in busy) / len(busy) <= 42.0, busy
        # the closed loop holds no rate: its two clients are always in flight, back to back
        closed = [s for s in got if s.closed == 2 and s.t > t_closed]
        assert closed and all(s.rate == 0.0 and s.sent > 0 and s.in_flight == 2 for s in closed), closed
        assert [s for s in got if s.t > t_idle][-1].sent == 0  # rate 0: idle
        assert server.answered == sum(s.ok for s in got)  # type: ignore[attr-defined]
    finally:
        server.shutdown()
