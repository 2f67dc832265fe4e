"""scanflow.loadgen and its two wrappers (demo Load, embedded Traffic) against a real loopback HTTP server.

The server is the standard library's threading HTTP server answering /predict like a replica would
(outputs, model_version, x-scanflow-upstream), so the whole send / time / judge / keep path runs for real.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from fastapi import FastAPI

from scanflow.demo.load import Load
from scanflow.embedded.traffic import Traffic
from scanflow.loadgen import LoadGenerator, apply_command, parse_second
from scanflow.loadgen_engine import Engine, Outcome, Second, due_count, percentile
from scanflow.loadgen_http import ProtocolError, Request, http_request, parse_head, read_body
from scanflow.tracking.feedback import FeedbackLog
from scanflow.tracking.feedback_api import feedback_router


class _Replica(BaseHTTPRequestHandler):
    """Answers label 7 for every row (so rows labelled 7 are 'correct'); 422 for a body without inputs."""

    def do_POST(self) -> None:  # http.server calls it by this name
        doc = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.server.bodies.append(doc)  # type: ignore[attr-defined]
        if isinstance(doc, dict):
            doc["_answered_at"] = time.time()  # not sent by the client: when this stub answered
        ok = self.path == "/predict" and isinstance(doc.get("inputs"), list)
        answer = {"outputs": [7], "model_version": 3, "request_id": doc.get("request_id") or "server-made"}
        out = json.dumps(answer if ok else {"detail": "no inputs"}).encode()
        self.send_response(200 if ok else 422)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out)))
        self.send_header("x-scanflow-upstream", "r0")
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: object) -> None:  # keep test output clean
        pass


@pytest.fixture
def replica(port: int) -> Iterator[tuple[str, list[dict]]]:
    server = ThreadingHTTPServer(("127.0.0.1", port), _Replica)
    server.bodies = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", server.bodies  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def wait_until(cond: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_the_open_loop_schedule_never_restarts() -> None:
    assert due_count(10.0, 0.0, 0.0, 0) == 1  # the first arrival is due at the start
    assert due_count(10.0, 0.0, 0.95, 0) == 10 and due_count(10.0, 0.0, 0.95, 10) == 0
    assert due_count(10.0, 0.0, 5.0, 3) == 48  # behind: every arrival is still owed (sent or unsent)
    assert due_count(0.0, 0.0, 5.0, 0) == 0


def test_request_and_response_heads() -> None:
    raw = http_request("http://127.0.0.1:8000/predict?x=1", b'{"inputs": [[1]]}', {"x-request-id": "a"})
    assert raw.startswith(b"POST /predict?x=1 HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nContent-Length: 17\r\n")
    assert raw.endswith(b"x-request-id: a\r\n\r\n" + b'{"inputs": [[1]]}')
    assert parse_head(b"HTTP/1.1 200 OK\r\ncontent-length: 12\r\nX-Up: r0\r\n\r\n") == (
        200, {"content-length": "12", "x-up": "r0"}, True)
    assert parse_head(b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n\r\n")[2] is False
    assert parse_head(b"HTTP/1.0 200 OK\r\n\r\n")[2] is False  # HTTP/1.0 closes unless it says keep-alive
    assert parse_head(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\n\r\n")[2] is True
    for garbage in (b"garbage\r\n\r\n", b"HTTP/2 200\r\n\r\n", b"HTTP/1.1 abc\r\n\r\n"):
        with pytest.raises(ProtocolError):
            parse_head(garbage)
    assert percentile([], 0.99) is None and percentile([5.0, 1.0, 3.0], 0.5) == 3.0


@pytest.mark.parametrize(("status", "headers", "wire", "body", "framed"), [
    (200, {"content-length": "5"}, b"hello+next", b"hello", True),
    (200, {"transfer-encoding": "chunked"}, b"3\r\nhel\r\n2;ext=1\r\nlo\r\n0\r\nTrailer: x\r\n\r\n", b"hello", True),
    (200, {}, b"to the end", b"to the end", False),  # close-delimited: the connection cannot be reused
    (204, {}, b"", b"", True),
])
def test_bodies_are_read_by_their_framing(status, headers, wire, body, framed) -> None:  # type: ignore[no-untyped-def]
    async def read() -> tuple[bytes, bool]:
        reader = asyncio.StreamReader()
        reader.feed_data(wire)
        reader.feed_eof()
        return await read_body(reader, status, headers)

    assert asyncio.run(read()) == (body, framed)


def test_a_bad_framing_is_a_protocol_error() -> None:
    async def read(headers: dict[str, str], wire: bytes) -> tuple[bytes, bool]:
        reader = asyncio.StreamReader()
        reader.feed_data(wire)
        reader.feed_eof()
        return await read_body(reader, 200, headers)

    with pytest.raises(ProtocolError):
        asyncio.run(read({"transfer-encoding": "chunked"}, b"zz\r\n"))
    with pytest.raises(ProtocolError):
        asyncio.run(read({"content-length": "-1"}, b""))


def test_the_child_hosts_protocol_lines() -> None:
    engine = Engine("http://127.0.0.1:1/predict", lambda c, n: Request(b"{}"), lambda r, o: True,
                    clients=4, timeout_s=1.0)
    assert apply_command(engine, '{"rate": 25}') and (engine.rate, engine.concurrency) == (25.0, 0)
    assert apply_command(engine, '{"closed": 9}') and (engine.rate, engine.concurrency) == (0.0, 4)  # capped
    assert apply_command(engine, "not json") and engine.concurrency == 4  # ignored, said on stderr
    assert not apply_command(engine, '{"stop": true}')
    s = Second(12.5, 40.0, 40, 39, 1, 0, 1.5, 9.0, 2, 0)
    from scanflow.loadgen import _second_line

    assert parse_second(_second_line(s)) == s
    with pytest.raises(ValueError):
        parse_second('{"t": 1}')


def test_open_loop_counts_arrivals_it_could_not_send_and_times_from_the_schedule() -> None:
    """A server that accepts connections and never answers: one slot, so every later arrival is unsent."""
    import socket

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    url = f"http://127.0.0.1:{srv.getsockname()[1]}/predict"
    try:
        gen = LoadGenerator(url, lambda i, n: Request(b"{}"), lambda r, o: o, clients=1, rate=50.0, timeout_s=1.0)
        with gen:
            wait_until(lambda: gen.unsent >= 20, 10.0)
        got = gen.results()
    finally:
        srv.close()
    assert gen.sent >= 1 and gen.unsent >= 20
    first = got[0]
    assert first.status == 0 and first.scheduled is not None
    assert first.latency_ms >= 1000.0 - 50  # from the scheduled send to the timeout


def test_open_loop_sends_on_schedule(replica) -> None:  # type: ignore[no-untyped-def]
    url, _ = replica
    with LoadGenerator(url + "/predict", lambda i, n: Request(b'{"inputs": [[0]]}'), lambda r, o: o,
                       clients=8, rate=100.0) as gen:
        wait_until(lambda: len(gen.results()) >= 30)
    got = sorted(o.scheduled for o in gen.results() if o.scheduled is not None)
    # every send was due on the 10 ms grid (a busy machine may leave arrivals unsent: gaps of k x 10 ms)
    steps = [(b - a) / 0.01 for a, b in itertools.pairwise(got)]
    assert all(k > 0.5 and abs(k - round(k)) < 1e-3 for k in steps), steps[:5]
    assert len(got) == gen.sent  # every request sent was answered and kept


def test_bad_arguments_are_refused() -> None:
    def judge(r: Request, o: Outcome) -> int:
        return o.status

    with pytest.raises(ValueError, match="clients"):
        LoadGenerator("http://127.0.0.1:1/", lambda i, n: Request(b"{}"), judge, clients=0)
    with pytest.raises(ValueError, match="rate"):
        LoadGenerator("http://127.0.0.1:1/", lambda i, n: Request(b"{}"), judge, clients=1, rate=0)
    with pytest.raises(ValueError, match="concurrency"):
        LoadGenerator("http://127.0.0.1:1/", lambda i, n: Request(b"{}"), judge, clients=1, rate=5, concurrency=1)
    with pytest.raises(ValueError, match="concurrency"):
        LoadGenerator("http://127.0.0.1:1/", lambda i, n: Request(b"{}"), judge, clients=2, concurrency=3)
    with pytest.raises(ValueError, match="plain http"):
        LoadGenerator("https://127.0.0.1:1/", lambda i, n: Request(b"{}"), judge, clients=1)
    with pytest.raises(ValueError, match="concurrency"):
        Load("http://127.0.0.1:1", np.zeros((2, 64)), concurrency=5, max_clients=2)


def test_generator_passes_worker_and_sequence_and_keeps_judged_answers(replica) -> None:  # type: ignore[no-untyped-def]
    url, bodies = replica
    sent: list[tuple[int, int]] = []

    def make(worker: int, n: int) -> Request:
        sent.append((worker, n))
        return Request(json.dumps({"inputs": [[worker, n]]}).encode(), meta=(worker, n))

    with LoadGenerator(url + "/predict", make, lambda r, o: (r.meta, o.status), clients=2) as gen:
        wait_until(lambda: len(gen.results()) >= 10)
    got = gen.results()
    assert all(status == 200 for _, status in got)
    for w in (0, 1):  # each worker counts its own requests from 0 without gaps
        ns = [n for (wk, n), _ in got if wk == w]
        assert ns == list(range(len(ns)))
    assert gen.in_flight == 0 and len(bodies) >= len(got)


def test_load_follows_the_concurrency_knob(replica) -> None:  # type: ignore[no-untyped-def]
    url, _ = replica
    with Load(url, np.arange(3 * 64, dtype=np.float32).reshape(3, 64), concurrency=0, max_clients=2) as load:
        time.sleep(0.3)  # nothing may be sent while no worker is enabled (absence: no event to await)
        assert load.samples() == []
        load.concurrency = 1
        wait_until(lambda: len(load.samples()) >= 5)
    s = load.samples()[0]
    assert (s.status, s.upstream, s.version) == (200, "r0", "3") and s.latency_ms > 0
    assert load.window(60).count >= 5


def test_traffic_judges_answers_against_true_labels(replica) -> None:  # type: ignore[no-untyped-def]
    url, bodies = replica
    x = np.zeros((4, 64))
    clean, drifted = (x, np.array([7, 7, 7, 7])), (x, np.array([1, 1, 1, 1]))
    with Traffic(url, clean, drifted, rate=200, clients=2) as t:
        wait_until(lambda: t.count() >= 6)
        t.drifted = True
        wait_until(lambda: sum(a.drifted for a in t.snapshot()) >= 6)
    assert t.failed() == [] and t.versions() == {"3"}
    assert t.accuracy(drifted=False) == 1.0 and t.accuracy(drifted=True) == 0.0
    assert t.answers == t.snapshot()  # the public list is the generator's store
    ids = [b["request_id"] for b in bodies]
    assert len(set(ids)) == len(ids) and not any("labels" in b for b in bodies)  # labels are feedback now
    assert t.feedback_counts().scheduled == 0  # no tracker_url: no feedback


def test_refused_connections_are_kept_as_failures(port: int) -> None:
    url = f"http://127.0.0.1:{port}"  # nothing listens
    with Load(url, np.zeros((1, 64)), concurrency=1, max_clients=1) as load:
        wait_until(lambda: len(load.samples()) >= 2)
    assert {s.status for s in load.samples()} == {0}
    with Traffic(url, (np.zeros((1, 64)), np.array([0])), (np.zeros((1, 64)), np.array([0])), clients=1) as t:
        wait_until(lambda: t.count() >= 2)
    assert all(a.status == 0 and a.error and "ConnectError" in a.error for a in t.snapshot())


TOKEN = "feedback-token"


@pytest.fixture
def tracker(serve_app, tmp_path) -> Iterator[tuple[str, FeedbackLog]]:  # type: ignore[no-untyped-def]
    """A Tracker-like app: the real feedback router over a real SQLite feedback log, on loopback."""
    log = FeedbackLog(f"sqlite:///{tmp_path / 'feedback.db'}")
    app = FastAPI()
    app.include_router(feedback_router(log, TOKEN))
    try:
        yield serve_app(app), log
    finally:
        log.close()


def test_traffic_posts_feedback_for_its_fraction_after_the_delay(replica, tracker) -> None:  # type: ignore[no-untyped-def]
    url, bodies = replica
    tracker_url, log = tracker
    x = np.zeros((4, 64))
    clean, drifted = (x, np.array([7, 7, 7, 7])), (x, np.array([1, 1, 1, 1]))
    delay = 0.8
    with Traffic(url, clean, drifted, rate=150, clients=2, seed=5, tracker_url=tracker_url, token=TOKEN,
                 feedback_fraction=0.3, feedback_delay_s=delay) as t:
        wait_until(lambda: t.count() >= 100)
        t.drifted = True
        wait_until(lambda: t.count() >= 250 and t.feedback_counts().acknowledged >= 40)
    counts = t.feedback_counts()
    answered = {b["request_id"] for b in bodies}
    assert not any("labels" in b for b in bodies)
    stored = []
    after = 0
    while page := log.since(after, 1000).records:
        stored += page
        after = page[-1].seq
    # about the stated fraction of the answered requests was chosen (seeded; binomial, n >= 250)
    assert 0.2 <= counts.scheduled / t.count() <= 0.4, counts
    assert counts.acknowledged == len(stored) == counts.scheduled - counts.dropped
    assert counts.dropped <= 0.3 * 150 * (delay + 0.5)  # only what was not due yet when the load stopped
    answered_at = {b["request_id"]: b["_answered_at"] for b in bodies}
    for rec in stored:  # never before the delay: each label arrived `delay` or more after its answer
        assert rec.request_id in answered and rec.labels in ([7], [1])
        assert rec.received_at >= answered_at[rec.request_id] + delay, rec


def test_no_feedback_when_the_fraction_is_zero(replica, tracker) -> None:  # type: ignore[no-untyped-def]
    url, _ = replica
    tracker_url, log = tracker
    pool = (np.zeros((2, 64)), np.array([7, 7]))
    with Traffic(url, pool, pool, rate=200, clients=2, tracker_url=tracker_url, token=TOKEN,
                 feedback_fraction=0.0, feedback_delay_s=0.0) as t:
        wait_until(lambda: t.count() >= 50)
    assert t.feedback_counts().scheduled == 0 and log.stats().stored == 0
