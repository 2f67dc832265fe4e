"""Replica process tests: a real registered MLflow model, real OS processes, real HTTP on loopback."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import httpx
import numpy as np
import orjson
import pytest
import uvicorn
from fastapi import FastAPI, Request
from serving_helpers import LoadResult, closed_loop, free_port, wait_for

from scanflow.serving import batchwire

pytestmark = pytest.mark.integration

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_bad_input_auth_info_threads_and_drain(digits_models, launch, digits_rows) -> None:  # type: ignore[no-untyped-def]
    r = launch("replica", "--model-uri", digits_models["v1"], "--service", "digits", "--replica-id", "r1",
               "--max-body-bytes", "200000", env={"SCANFLOW_TOKEN": TOKEN})
    url = r.url + "/predict"
    ok = httpx.post(url, json={"inputs": digits_rows[:3], "request_id": "q1"})
    assert ok.status_code == 200, ok.text
    assert ok.json()["client_request_id"] == "q1" and len(ok.json()["outputs"]) == 3
    assert "probabilities" not in ok.json()

    cases = [
        (b'{"inputs": [[1, 2, 3]]}', 422, "64 features"),
        (b'{"inputs": [[NaN' + b", 0" * 63 + b"]]}", 422, "NaN"),
        (b'{"inputs": "x"}', 422, "list of rows"),
        (b"not json", 422, "not valid JSON"),
        (b'{"inputs": [[' + b"0.5, " * 50_000 + b"0.5]]}", 413, "over the limit"),
    ]
    for body, status, fragment in cases:
        resp = httpx.post(url, content=body, headers={"Content-Type": "application/json"})
        assert resp.status_code == status, (body[:40], resp.text)
        assert fragment in resp.json()["detail"]

    assert httpx.post(r.url + "/admin/threads", json={"threads": 1}).status_code == 401
    bad = httpx.post(r.url + "/admin/threads", json={"threads": 1}, headers={"Authorization": "Bearer no"})
    assert bad.status_code == 401 and TOKEN not in bad.text
    assert httpx.post(r.url + "/admin/threads", json={"threads": 0}, headers=AUTH).status_code == 422
    assert httpx.post(r.url + "/admin/threads", json={"threads": 1}, headers=AUTH).json()["threads"] == 1
    info = httpx.get(r.url + "/info").json()
    assert info["threads"] == 1 and info["model_version"] == "1" and info["n_features"] == 64
    assert info["cpus"] and info["pid"] == r.popen.pid and info["replica_id"] == "r1"

    metrics = httpx.get(r.url + "/metrics").text
    for name in ("scanflow_replica_request_latency_seconds_bucket", "scanflow_replica_queue_depth",
                 "scanflow_replica_in_flight", "scanflow_replica_batch_size_rows_bucket"):
        assert name in metrics
    assert 'scanflow_replica_model_info{model_uri="models:/serving-digits/1",version="1"} 1.0' in metrics
    assert 'scanflow_replica_requests_total{status="422"} 4.0' in metrics

    bad_swap = httpx.post(r.url + "/admin/model", json={"model_uri": "models:/no-such-model/1"}, headers=AUTH,
                          timeout=30)
    assert bad_swap.status_code == 422 and "no-such-model" in bad_swap.json()["detail"]

    # The gateway's coalesced call: each item gets exactly what /predict would answer it, in order.
    items = [orjson.dumps({"inputs": digits_rows[i : i + 1], "request_id": f"b{i}"}) for i in range(4)]
    items[1:1] = [body for body, _, _ in cases]
    resp = httpx.post(r.url + "/predict_batch", content=batchwire.encode_request(items),
                      headers={"Content-Type": "application/x-scanflow-batch"})
    assert resp.status_code == 200, resp.text
    answers = batchwire.decode_response(resp.content, len(items))
    assert [s for s, _ in answers] == [200, *(status for _, status, _ in cases), 200, 200, 200]
    for (_, _, fragment), (_, body) in zip(cases, answers[1:-3], strict=True):
        assert fragment in orjson.loads(body)["detail"]
    good = [orjson.loads(body) for s, body in answers if s == 200]
    assert [d["client_request_id"] for d in good] == ["b0", "b1", "b2", "b3"]
    assert {d["model_version"] for d in good} == {"1"}
    single = httpx.post(url, json={"inputs": digits_rows[2:3]}).json()
    assert good[2]["outputs"] == single["outputs"]
    framing = httpx.post(r.url + "/predict_batch", content=b'{"sizes": [5]}\nabc')
    assert framing.status_code == 400 and "add up" in framing.json()["detail"]

    drained = httpx.post(r.url + "/admin/drain", headers=AUTH, timeout=40)
    assert drained.json() == {"drained": True, "in_flight": 0}
    assert httpx.get(r.url + "/ready").status_code == 503
    assert httpx.post(url, json={"inputs": digits_rows[:1]}).status_code == 503
    assert httpx.post(r.url + "/predict_batch", content=batchwire.encode_request(items)).status_code == 503


@pytest.mark.slow
async def test_hot_swap_under_load_fails_nothing_and_tags_one_version(digits_models, launch, digits_rows) -> None:  # type: ignore[no-untyped-def]
    r = await asyncio.to_thread(launch, "replica", "--model-uri", digits_models["v1"], "--allow-anonymous")
    stop, progress = asyncio.Event(), LoadResult()
    load = asyncio.create_task(closed_loop(r.url, {"inputs": digits_rows}, 4, stop, progress))
    async with httpx.AsyncClient(timeout=60) as http:
        await wait_for(lambda: load.done() or progress.ok >= 50, 30, "50 answers from v1")
        swap = await http.post(r.url + "/admin/model", json={"model_uri": digits_models["v2"]})
        assert swap.status_code == 200, swap.text
        assert swap.json()["model_version"] == "2" and swap.json()["previous_version"] == "1"
        after = progress.ok
        await wait_for(lambda: load.done() or progress.ok >= after + 50, 30, "50 answers after the swap")
    stop.set()
    result = await load
    assert result.failures == []
    by_version: dict[str, set[tuple[int, ...]]] = {}
    for resp in result.responses:
        by_version.setdefault(resp["model_version"], set()).add(tuple(resp["outputs"]))
    assert set(by_version) == {"1", "2"}
    # Same input every time: one output vector per version, and the two differ (no mixed batch).
    assert len(by_version["1"]) == 1 and len(by_version["2"]) == 1
    assert by_version["1"] != by_version["2"]
    for client in result.per_client:  # versions switch once, monotonically, for every client
        versions = [resp["model_version"] for resp in client]
        assert versions == sorted(versions)


class TrackerStub:
    """A tiny Tracker: stores every record POSTed to /predictions."""

    def __init__(self) -> None:
        self.records: list[dict] = []
        self.app = FastAPI()

        @self.app.post("/predictions")
        async def predictions(request: Request) -> dict[str, int]:
            batch = await request.json()
            self.records.extend(batch)
            return {"accepted": len(batch)}


@pytest.fixture
def tracker_port() -> int:
    return free_port()


def _serve_in_thread(app: FastAPI, port: int) -> tuple[uvicorn.Server, threading.Thread]:
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    return server, thread


@pytest.fixture
def tracker_stub(tracker_port: int) -> Iterator[tuple[TrackerStub, callable]]:  # type: ignore[valid-type]
    """(stub, start): the stub is down until start() is called."""
    stub = TrackerStub()
    running: list[tuple[uvicorn.Server, threading.Thread]] = []

    def start() -> None:
        running.append(_serve_in_thread(stub.app, tracker_port))

    try:
        yield stub, start
    finally:
        for server, thread in running:
            server.should_exit = True
            thread.join(10)


async def test_records_reach_a_tracker_that_was_down_exactly_once(  # type: ignore[no-untyped-def]
    digits_models, launch, digits_rows, tracker_stub, tracker_port
) -> None:
    stub, start = tracker_stub
    r = await asyncio.to_thread(
        launch, "replica", "--model-uri", digits_models["v1"], "--allow-anonymous", "--service", "digits",
        "--tracker-url", f"http://127.0.0.1:{tracker_port}",
    )
    async with httpx.AsyncClient(timeout=10) as http:
        sent = []
        for i in range(20):
            body = {"inputs": digits_rows[i : i + 2], "request_id": f"req-{i}"}
            resp = await http.post(r.url + "/predict", json=body)
            assert resp.status_code == 200
            sent.append(resp.json())
        # True labels are feedback for the Tracker, not part of a prediction: refused, and not recorded.
        labelled = await http.post(r.url + "/predict", json={**body, "request_id": "lab-0", "labels": [1, 2]})
        assert labelled.status_code == 422
        assert labelled.json()["detail"] == "labels are feedback: POST them to the Tracker's /feedback with the request_id"
        # Ten more in one coalesced call, as the gateway sends them, among them two refused (one labelled,
        # on the otherwise valid fast path's turf): their neighbours get 200, one record each.
        items = [orjson.dumps({"inputs": digits_rows[i : i + 2], "request_id": f"req-{i}"}) for i in range(20, 30)]
        with_labels = orjson.dumps({"inputs": digits_rows[:2], "request_id": "lab-1", "labels": [1, 2]})
        resp = await http.post(
            r.url + "/predict_batch", content=batchwire.encode_request([*items[:5], with_labels, *items[5:], b"{}"])
        )
        answers = batchwire.decode_response(resp.content, 12)
        assert [s for s, _ in answers] == [200] * 5 + [422] + [200] * 5 + [422]
        assert b"labels are feedback" in answers[5][1]
        sent += [orjson.loads(b) for s, b in answers if s == 200]

        async def gauge(name: str) -> float:
            text = (await http.get(r.url + "/metrics")).text
            return float(next(x for x in text.splitlines() if x.startswith(name + " ")).split()[1])

        async def until(name: str, predicate, what: str) -> None:  # type: ignore[no-untyped-def]
            deadline = asyncio.get_running_loop().time() + 20
            while not predicate(await gauge(name)):
                assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
                await asyncio.sleep(0.05)

        # The tracker is down: the replica keeps answering, keeps the records and counts failed sends.
        await until("scanflow_replica_tracker_failed_sends_total", lambda v: v >= 2, "two failed sends")
        assert stub.records == [] and await gauge("scanflow_replica_tracker_pending_records") == 30
        start()
        await until("scanflow_replica_tracker_sent_records_total", lambda v: v == 30, "30 records delivered")
        assert await gauge("scanflow_replica_tracker_pending_records") == 0
        assert await gauge("scanflow_replica_tracker_dropped_records_total") == 0
    assert sorted(rec["client_request_id"] for rec in stub.records) == sorted(f"req-{i}" for i in range(30))
    assert len({rec["record_id"] for rec in stub.records}) == 30
    rec = next(x for x in stub.records if x["client_request_id"] == "req-3")
    assert rec["service"] == "digits" and "labels" not in rec and rec["model_version"] == "1"
    assert rec["outputs"] == sent[3]["outputs"] and len(rec["inputs"]) == 2 and len(rec["inputs"][0]) == 64
    assert rec["latency_ms"] > 0 and rec["ts"] > 0
    for i in (20, 24, 29):  # a coalesced call's records take their rows from one matrix: each gets its own
        rec = next(x for x in stub.records if x["client_request_id"] == f"req-{i}")
        assert np.allclose(rec["inputs"], np.asarray(digits_rows[i : i + 2], dtype=np.float32))
