"""Serving hardening against a running stack (real replica and gateway processes on loopback, a real
Tracker app): poison bodies inside coalesced batches fail only themselves, prediction records survive a
SIGKILLed replica while the Tracker is down (durable spool), slow bodies time out, drain is reversible,
and the admin endpoints refuse what they should."""

from __future__ import annotations

import asyncio
import socket
import sqlite3
import time
from pathlib import Path

import httpx
import orjson
import pytest
from serving_helpers import free_port, read_body, wait_for
from test_serving_sink import tracker

from scanflow.serving import batchwire
from scanflow.tracking.api import MAX_BODY_BYTES

pytestmark = [pytest.mark.integration]

TOKEN = "sink-test-token"  # the Tracker of test_serving_sink checks this one
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SURROGATE = b'{"inputs": [[' + b"0.5, " * 63 + b'0.5]], "request_id": "\\ud800"}'
DEEP = b'{"inputs": [[' + b"0.5, " * 63 + b'0.5]], "x": ' + b"[" * 15_000 + b"]" * 15_000 + b"}"  # 30 KB


def _good(rows: list[list[float]], i: int) -> bytes:
    return orjson.dumps({"inputs": [rows[i % len(rows)]], "request_id": f"good-{i}"})


def test_poison_items_in_a_coalesced_call_fail_alone(digits_models, launch, digits_rows) -> None:  # type: ignore[no-untyped-def]
    r = launch("replica", "--model-uri", digits_models["v1"], "--allow-anonymous")
    bodies = [_good(digits_rows, 0), SURROGATE, _good(digits_rows, 1), DEEP, _good(digits_rows, 2)]
    resp = httpx.post(r.url + "/predict_batch", content=batchwire.encode_request(bodies),
                      headers={"Content-Type": batchwire.CONTENT_TYPE.decode()}, timeout=10)
    assert resp.status_code == 200, resp.text
    items = batchwire.decode_response(resp.content, len(bodies))
    assert [s for s, _ in items] == [200, 422, 200, 422, 200]
    assert "lone surrogates" in orjson.loads(items[1][1])["detail"]
    assert "nested 15001 levels deep" in orjson.loads(items[3][1])["detail"]
    assert [orjson.loads(items[i][1])["client_request_id"] for i in (0, 2, 4)] == ["good-0", "good-1", "good-2"]
    for body in (SURROGATE, DEEP):  # the direct path: the same 422, never a 500
        direct = httpx.post(r.url + "/predict", content=body, headers={"Content-Type": "application/json"})
        assert direct.status_code == 422, direct.text


async def test_poison_through_the_coalescing_gateway_fails_only_itself(digits_models, launch, digits_rows) -> None:  # type: ignore[no-untyped-def]
    # Two batch slots on a replica that then waits 50 ms to fill each model call (it waits only once its
    # calls overlap) keep the gateway's slots busy, so the requests arriving meanwhile leave together:
    # poison and good requests share calls.
    r = await asyncio.to_thread(launch, "replica", "--model-uri", digits_models["v1"], "--allow-anonymous",
                                "--max-batch-wait-ms", "50", "--max-batch-size", "4096")
    gw = await asyncio.to_thread(launch, "gateway", "--replica", r.url, "--allow-anonymous", "--batches-per-replica", "2")
    await wait_for(lambda: httpx.get(gw.url + "/ready").status_code == 200, 10, "the gateway to see its replica")
    kinds = ["good"] * 60 + ["surrogate"] * 6 + ["deep"] * 6
    kinds = [kinds[(i * 7) % len(kinds)] for i in range(len(kinds))]  # poison spread among the good
    body_of = {"surrogate": lambda i: SURROGATE, "deep": lambda i: DEEP, "good": lambda i: _good(digits_rows, i)}
    for _ in range(3):  # all at once, three times: many land in the same coalesced call
        answers = await _burst(gw.url, [body_of[k](i) for i, k in enumerate(kinds)])
        for i, (kind, (status, doc)) in enumerate(zip(kinds, answers, strict=True)):
            if kind == "good":
                assert status == 200, doc
                assert doc["client_request_id"] == f"good-{i}"
            else:
                assert status == 422, doc
                assert ("surrogates" if kind == "surrogate" else "levels deep") in doc["detail"]
    counts = (await asyncio.to_thread(httpx.get, gw.url + "/admin/state")).json()["counts"]
    assert counts["coalesced_requests"] == 3 * len(kinds)  # every request went through a coalesced call ...
    assert counts["coalesced_calls"] <= len(kinds) // 4  # ... shared with others (216 requests, <= 18 calls)
    assert counts["coalesced_refused"] == 0 and counts["retries"] == 0  # no call failed as a whole


async def test_records_survive_a_sigkilled_replica_while_the_tracker_is_down(  # type: ignore[no-untyped-def]
    digits_models, launch, digits_rows, tmp_path: Path
) -> None:
    tport, spool = free_port(), tmp_path / "spool"
    args = ("--model-uri", digits_models["v1"], "--tracker-url", f"http://127.0.0.1:{tport}",
            "--spool-dir", str(spool), "--spool-fsync-s", "0.2")
    env = {"SCANFLOW_TOKEN": TOKEN}
    r = await asyncio.to_thread(launch, "replica", *args, env=env)
    gw = await asyncio.to_thread(launch, "gateway", "--replica", r.url, "--allow-anonymous")
    await wait_for(lambda: httpx.get(gw.url + "/ready").status_code == 200, 10, "the gateway to see its replica")
    served: set[str] = set()
    async with httpx.AsyncClient(timeout=10, limits=httpx.Limits(max_connections=50)) as http:
        for round_ in range(6):  # coalesced through the gateway (one spool write per call) ...
            answers = await asyncio.gather(*(http.post(gw.url + "/predict", content=_good(digits_rows, 1000 * round_ + i),
                                                       headers={"Content-Type": "application/json"})
                                             for i in range(40)))
            for resp in answers:
                assert resp.status_code == 200, resp.text
                served.add(resp.json()["request_id"])
        for i in range(30):  # ... and direct, without a request_id (the replica makes one up)
            resp = await http.post(r.url + "/predict", json={"inputs": [digits_rows[i]]})
            assert resp.status_code == 200, resp.text
            served.add(resp.json()["request_id"])
    assert len(served) == 270
    doc = (await asyncio.to_thread(httpx.get, r.url + "/info")).json()
    info = doc["spool"]
    assert info["written"] == 270 and info["bytes"] > 0 and doc["tracker_pending"] == 270
    r.popen.kill()  # SIGKILL: nothing flushed on the way out
    r.popen.wait(10)

    r2 = await asyncio.to_thread(launch, "replica", *args, env=env)  # same spool dir, Tracker still down
    assert (await asyncio.to_thread(httpx.get, r2.url + "/info")).json()["spool"]["replayed"] == 270
    async with tracker(tmp_path, tport, router_limit=MAX_BODY_BYTES, app_limit=MAX_BODY_BYTES) as log:
        await wait_for(lambda: log.stats().stored >= 270, 30, "the replayed records to reach the Tracker")
        async with httpx.AsyncClient(timeout=5) as http:  # the Tracker answered: the replica forgets them
            for _ in range(500):
                if "scanflow_replica_tracker_pending_records 0.0" in (await http.get(r2.url + "/metrics")).text:
                    break
                await asyncio.sleep(0.02)
            else:
                raise AssertionError("the replica still holds records the Tracker stored")
            spool_after = (await http.get(r2.url + "/info")).json()["spool"]
        assert spool_after["bytes"] < info["bytes"]  # delivered segments are deleted
    db = sqlite3.connect(tmp_path / "pred.db")
    try:
        rows = db.execute("SELECT request_id, COUNT(*) FROM prediction_records GROUP BY request_id").fetchall()
    finally:
        db.close()
    assert {rid for rid, _ in rows} == served and all(n == 1 for _, n in rows)  # every one, exactly once


async def _burst(url: str, bodies: list[bytes]) -> list[tuple[int, dict]]:
    """POST each body on its own connection, all connections opened first and the requests then written
    in one go, so they reach the gateway together; (status, JSON answer) per body, in order."""
    host, port = url.removeprefix("http://").split(":")
    conns = [await asyncio.open_connection(host, int(port)) for _ in bodies]
    for (_, writer), body in zip(conns, bodies, strict=True):
        writer.write(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    out = []
    for reader, writer in conns:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)
        length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")))
        out.append((int(head.split(b" ", 2)[1]), orjson.loads(await reader.readexactly(length))))
        writer.close()
    return out


def _raw_post_headers(url: str, length: int, first_bytes: bytes) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (length, first_bytes))
    return sock


def _read_all(sock: socket.socket) -> bytes:
    out = b""
    while chunk := sock.recv(65536):  # recv returns b"" once the server closed the connection
        out += chunk
    return out


def test_slow_bodies_time_out_and_the_admin_hardening(digits_models, launch, digits_rows, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    r = launch("replica", "--model-uri", digits_models["v1"], "--body-timeout-s", "0.5", env={"SCANFLOW_TOKEN": TOKEN})
    gw = launch("gateway", "--replica", r.url, "--body-timeout-s", "0.5", env={"SCANFLOW_TOKEN": TOKEN})
    for url in (r.url, gw.url):  # a body that never arrives in full: 408, then the connection is closed
        t0 = time.monotonic()
        sock = _raw_post_headers(url, 1000, b'{"inputs": ')
        answer = _read_all(sock)
        sock.close()
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"not received within 0.5 s" in answer and time.monotonic() - t0 < 5

    row = digits_rows[0]
    for url in (r.url, gw.url):  # a body declared as something other than JSON: 415; none declared: JSON
        refused = httpx.post(url + "/predict", content=orjson.dumps({"inputs": [row]}),
                             headers={"Content-Type": "text/plain"})
        assert refused.status_code == 415 and "not JSON" in refused.json()["detail"]
        assert httpx.post(url + "/predict", content=orjson.dumps({"inputs": [row]})).status_code == 200
        charset = httpx.post(url + "/predict", content=orjson.dumps({"inputs": [row]}),
                             headers={"Content-Type": "application/json; charset=utf-8"})
        assert charset.status_code == 200

    assert httpx.post(r.url + "/admin/drain", headers=AUTH, timeout=40).json()["drained"] is True
    assert httpx.get(r.url + "/ready").status_code == 503
    assert httpx.post(r.url + "/predict", json={"inputs": [row]}).status_code == 503
    assert httpx.post(r.url + "/admin/undrain").status_code == 401  # token-guarded like drain
    assert httpx.post(r.url + "/admin/undrain", headers=AUTH).json() == {"draining": False, "was_draining": True}
    assert httpx.get(r.url + "/ready").status_code == 200
    assert httpx.post(r.url + "/predict", json={"inputs": [row]}).status_code == 200

    for threads in (True, False, "2", 1.5):
        bad = httpx.post(r.url + "/admin/threads", json={"threads": threads}, headers=AUTH)
        assert bad.status_code == 422, (threads, bad.text)
    assert httpx.post(r.url + "/admin/threads", json={"threads": 1}, headers=AUTH).status_code == 200

    local = tmp_path / "model"
    for uri in (f"file://{local}", str(local), "s3://bucket/model"):
        swap = httpx.post(r.url + "/admin/model", json={"model_uri": uri}, headers=AUTH, timeout=30)
        assert swap.status_code == 422 and "--allow-local-models" in swap.json()["detail"], swap.text

    for url in ("http://127.0.0.1:9?x=1", "http://127.0.0.1:9/#frag"):
        assert httpx.put(gw.url + "/admin/backup", json={"url": url}, headers=AUTH).status_code == 422
        assert httpx.put(gw.url + "/admin/replicas", json={"replicas": [url]}, headers=AUTH).status_code == 422
    assert httpx.put(gw.url + "/admin/backup", json={"url": r.url}, headers=AUTH).status_code == 200


def test_a_whole_call_error_is_not_copied_to_every_item(launch, serve_app) -> None:  # type: ignore[no-untyped-def]
    """A replica that fails whole coalesced calls (here: 500 to every /predict_batch, as a replica
    with a bug in its batch path would) must not fail good requests: the gateway forwards each alone."""
    seen: list[str] = []

    async def replica(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        seen.append(scope["path"])
        if scope["path"] == "/ready":
            status, answer = 200, b"{}"
        elif scope["path"] == "/predict_batch":
            status, answer = 500, b'{"detail": "batch path broken"}'
        else:  # /predict: echo which request this was
            status, answer = 200, orjson.dumps({"request_id": orjson.loads(body)["request_id"]})
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": answer})

    url = serve_app(replica)
    gw = launch("gateway", "--replica", url, "--allow-anonymous")
    answers = asyncio.run(_burst(gw.url, [orjson.dumps({"request_id": f"q{i}"}) for i in range(20)]))
    assert [(s, d["request_id"]) for s, d in answers] == [(200, f"q{i}") for i in range(20)]
    counts = httpx.get(gw.url + "/admin/state").json()["counts"]
    assert counts["coalesced_refused"] >= 1 and seen.count("/predict") == 20
