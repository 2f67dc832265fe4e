"""Units of the serving hardening: the record spool on a real directory (append, acknowledge, replay after
a crash, bound, torn lines, lock), the sink's use of it, and the payload guards (JSON depth, lone
surrogates, one body's surprise staying its own)."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from scanflow.serving.payload import (
    MAX_JSON_DEPTH,
    PayloadError,
    PredictRequest,
    decode_json,
    json_depth,
    parse_batch,
    parse_predict,
)
from scanflow.serving.sink import TrackerSink
from scanflow.serving.spool import RecordSpool, SpoolLocked


def _lines(n: int, start: int = 0) -> list[bytes]:
    return [orjson.dumps({"request_id": f"r{i}", "inputs": [[0.5] * 8]}) for i in range(start, start + n)]


def _crash(spool: RecordSpool) -> None:
    """What SIGKILL leaves: the files as written, no fsync or clean-up; only the lock goes (the kernel
    drops it with the process)."""
    spool._stop.set()
    os.close(spool._lock_fd)
    spool._lock_fd = -1


def test_spool_replays_what_was_not_acknowledged_after_a_crash(tmp_path: Path) -> None:
    a = RecordSpool(tmp_path, rotate_bytes=1000)
    assert a.open() == []
    lines = _lines(40)
    for i in range(0, 40, 4):
        assert a.append(lines[i : i + 4])
    segments = sorted(tmp_path.glob("seg-*.jsonl"))
    assert len(segments) > 2  # rotated by size
    a.ack(25)
    left = sorted(tmp_path.glob("seg-*.jsonl"))
    assert len(left) < len(segments)  # fully delivered segments are gone
    _crash(a)

    b = RecordSpool(tmp_path)
    replay = b.open()
    # Every record not acknowledged comes back, in order; a few acknowledged ones of a partly
    # delivered segment may come back too (the Tracker de-duplicates them by request_id).
    assert replay == lines[40 - len(replay) :] and 15 <= len(replay) < 25 + 15
    assert b.stats.replayed == len(replay)
    b.ack(len(replay))
    b.close()
    assert RecordSpool(tmp_path).open() == []


def test_spool_bound_lock_and_torn_lines(tmp_path: Path) -> None:
    s = RecordSpool(tmp_path, max_bytes=500)
    s.open()
    with pytest.raises(SpoolLocked):
        RecordSpool(tmp_path).open()
    lines = _lines(20)
    n = s.fits(lines)
    assert 0 < n < 20 and s.stats.refused_full == 20 - n
    assert s.append(lines[:n]) and s.size_bytes <= 500
    assert s.fits(lines[n:]) == 0
    _crash(s)
    seg = max(tmp_path.glob("seg-*.jsonl"))
    with open(seg, "ab") as fh:  # a power cut: zeros in place of a line, then half a line
        fh.write(b"\x00\x00\x00\n" + lines[0][:10])
    again = RecordSpool(tmp_path)
    assert again.open() == lines[:n]
    assert again.stats.torn_lines == 1 and again.stats.torn_tail_bytes == 10
    again.close()


def test_sink_spools_each_record_before_it_is_sent_and_refuses_over_the_bound(tmp_path: Path) -> None:
    spool = RecordSpool(tmp_path, max_bytes=600)
    sink = TrackerSink("http://127.0.0.1:9", spool=spool)
    spool.open()
    recs = [orjson.loads(line) for line in _lines(30)]
    taken = sink.record_many(recs)
    assert 0 < taken < 30 and sink.stats.dropped == 30 - taken and sink.pending == taken
    assert spool.stats.written == taken
    sink._pop(taken)  # as after a delivery: the spool's records are acknowledged with them
    spool.close()
    assert RecordSpool(tmp_path).open() == []


def test_json_depth_is_bounded_before_the_recursive_parser() -> None:
    assert json_depth(b'{"a": [[1, 2], [3]], "s": "[[[[{{"}') == 3
    deep = b"[" * 20_000 + b"]" * 20_000
    with pytest.raises(PayloadError) as err:
        decode_json(deep)
    assert err.value.status == 422 and f"at most {MAX_JSON_DEPTH}" in err.value.message
    assert decode_json(b'{"x": NaN}')["x"] != 0  # the stdlib fallback still reads NaN (to name it)


def test_a_lone_surrogate_request_id_is_refused_and_stays_its_own_answer() -> None:
    row = b"[" + b"0.5, " * 63 + b"0.5]"
    bad = b'{"inputs": [' + row + b'], "request_id": "\\ud800"}'
    with pytest.raises(PayloadError, match="lone surrogates"):
        parse_predict(bad, n_features=64, max_rows=10)
    ok = b'{"inputs": [' + row + b'], "request_id": "caf\\u00e9"}'
    assert parse_predict(ok, n_features=64, max_rows=10).request_id == "café"
    deep = b'{"inputs": [' + row + b'], "x": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    parsed = parse_batch([ok, bad, deep, ok], n_features=64, max_rows=10, max_body_bytes=1 << 20)
    kinds = [type(i) for i in parsed.items]
    assert kinds == [PredictRequest, PayloadError, PayloadError, PredictRequest]
    assert parsed.x is not None and parsed.x.shape == (2, 64)


async def test_an_unusable_spool_directory_leaves_the_sink_in_memory(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")  # a spool "directory" under a file cannot be created
    sink = TrackerSink("http://127.0.0.1:9", spool=RecordSpool(tmp_path / "file" / "spool"))
    sink.start()
    try:
        assert sink.spool is None
        assert sink.record({"request_id": "r1"}) and sink.pending == 1
    finally:
        await sink.stop(flush_timeout_s=0.1)


async def test_a_model_failure_on_a_batch_is_retried_item_by_item() -> None:
    """The replica's real ASGI app, a model that cannot take one item's rows: only that item fails."""
    import numpy as np

    from scanflow.serving import batchwire
    from scanflow.serving.model import LoadedModel
    from scanflow.serving.replica_server import ReplicaConfig, create_app

    def predict(x: np.ndarray) -> tuple[list, np.ndarray | None]:
        if (x[:, 0] > 0.9).any():
            raise ValueError("cannot score this row")
        return [0] * len(x), None

    app = create_app(ReplicaConfig(model_uri="models:/m/1", allow_anonymous=True))
    bodies = [orjson.dumps({"inputs": [[v, 0.0]], "request_id": f"q{i}"}) for i, v in enumerate((0.1, 0.95, 0.2))]
    payload = batchwire.encode_request(bodies)
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": payload, "more_body": False}

    async def send(msg: dict) -> None:
        sent.append(msg)

    async with app.replica.lifespan(app.api):
        await app.replica._install(LoadedModel("m", "models:/m/1", "1", 2, predict))
        await app({"type": "http", "method": "POST", "path": "/predict_batch", "headers": []}, receive, send)
    items = batchwire.decode_response(sent[1]["body"], 3)
    assert [s for s, _ in items] == [200, 500, 200]
    assert "cannot score this row" in orjson.loads(items[1][1])["detail"]
    assert orjson.loads(items[2][1])["client_request_id"] == "q2"
