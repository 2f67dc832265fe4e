"""Gateway tests with real replica processes: the admin API and bad input, a replica SIGKILLed under
load fails no client request, failover to a backup and failback, the route override. The kill and the
failover run on both of the gateway's fronts (`--front fast`: POST /predict answered from the protocol,
a failed coalesced call retried by a task; `--front asgi`: every request through the ASGI cycle)."""

from __future__ import annotations

import asyncio
import signal
import time

import httpx
import pytest
from serving_helpers import LoadResult, closed_loop, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

INTERVAL = 0.5
LABELS_AT = {3: {"labels": [0]}}  # request index -> labels it (wrongly) carries in /predict
FRONTS = pytest.mark.parametrize("front", ["fast", "asgi"])


def _state(gw_url: str) -> dict:
    return httpx.get(gw_url + "/admin/state", timeout=5).json()


def _healthy(gw_url: str, replica_url: str) -> bool:
    return next(r["healthy"] for r in _state(gw_url)["replicas"] if r["url"] == replica_url)


@FRONTS
async def test_admin_api_then_sigkill_a_replica_under_load_fails_no_request(digits_models, launch, digits_rows, front) -> None:  # type: ignore[no-untyped-def]
    r1 = await asyncio.to_thread(launch, "replica", "--model-uri", digits_models["v1"], "--allow-anonymous")
    r2 = await asyncio.to_thread(launch, "replica", "--model-uri", digits_models["v1"], "--allow-anonymous")
    gw = await asyncio.to_thread(
        launch, "gateway", "--service", "digits", "--replica", r1.url, "--replica", r2.url,
        "--health-interval-s", str(INTERVAL), "--allow-anonymous", "--max-body-bytes", "100000", "--front", front,
    )
    async with httpx.AsyncClient(timeout=10) as http:  # admin API and bad input first
        assert (await http.put(gw.url + "/admin/replicas", json={"replicas": []})).status_code == 200
        empty = await http.post(gw.url + "/predict", json={"inputs": digits_rows[:1]})
        assert empty.status_code == 503 and "no healthy replica" in empty.json()["detail"]
        assert (await http.put(gw.url + "/admin/replicas", json={"replicas": ["localhost:1"]})).status_code == 422
        put = await http.put(gw.url + "/admin/replicas", json={"replicas": [r1.url + "/", r2.url]})
        assert put.status_code == 200
        assert [(r["url"], r["healthy"]) for r in put.json()["replicas"]] == [(r1.url, True), (r2.url, True)]
        bad = await http.post(gw.url + "/predict", json={"inputs": [[1.0, 2.0]]})  # the replica's 422 passes
        assert bad.status_code == 422 and "64 features" in bad.json()["detail"]
        assert (await http.post(gw.url + "/predict", content=b"x" * 200_000)).status_code == 413
        # Concurrent clients share coalesced upstream calls; each still gets exactly its own answer.
        expected = (await http.post(r1.url + "/predict", json={"inputs": digits_rows})).json()["outputs"]
        before = _state(gw.url)["counts"]
        # One of them carries labels: its own 422 comes back through the shared call, the others' 200s.
        answers = await asyncio.gather(*(
            http.post(gw.url + "/predict", json={"inputs": [row], "request_id": f"c{i}", **LABELS_AT.get(i, {})})
            for i, row in enumerate(digits_rows)
        ))
        assert [a.status_code for a in answers] == [422 if i in LABELS_AT else 200 for i in range(len(digits_rows))]
        assert "labels are feedback" in answers[3].json()["detail"]
        ok = [i for i in range(len(digits_rows)) if i not in LABELS_AT]
        assert [answers[i].json()["client_request_id"] for i in ok] == [f"c{i}" for i in ok]
        assert [answers[i].json()["outputs"][0] for i in ok] == [expected[i] for i in ok]
        after = _state(gw.url)["counts"]
        assert after["coalesced_requests"] - before["coalesced_requests"] == len(digits_rows)

    stop, progress = asyncio.Event(), LoadResult()
    load = asyncio.create_task(closed_loop(gw.url, {"inputs": digits_rows[:1]}, 6, stop, progress))
    await wait_for(lambda: load.done() or progress.ok >= 100, 30, "100 answers through the gateway")
    r1.popen.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    # Dead replica leaves the set (connection errors mark it at once; the health check at the latest).
    took = await wait_for(lambda: not _healthy(gw.url, r1.url), 10, "r1 marked unhealthy")
    assert took <= 2 * INTERVAL + 1.0  # + slack for a loaded 2-core machine
    served_by_r1 = next(r["requests"] for r in _state(gw.url)["replicas"] if r["url"] == r1.url)
    before = progress.ok
    await wait_for(
        lambda: load.done() or (progress.ok >= before + 100 and time.monotonic() - killed_at > 3 * INTERVAL),
        30, "100 more answers and three health intervals",
    )
    stop.set()
    result = await load
    assert result.failures == []
    state = _state(gw.url)
    assert next(r["requests"] for r in state["replicas"] if r["url"] == r1.url) == served_by_r1
    late = result.per_client[0][-20:]
    assert all(resp["upstream"] == r2.url for resp in late)
    metrics = (await asyncio.to_thread(httpx.get, gw.url + "/metrics")).text
    assert "scanflow_gateway_request_latency_seconds_bucket" in metrics
    assert "scanflow_gateway_upstream_errors_total" in metrics


@FRONTS
async def test_failover_to_backup_and_failback(digits_models, launch, digits_rows, tmp_path, front) -> None:  # type: ignore[no-untyped-def]
    primary = await asyncio.to_thread(launch, "replica", "--model-uri", digits_models["v1"], "--allow-anonymous")
    backup = await asyncio.to_thread(launch, "replica", "--model-uri", digits_models["v2"], "--allow-anonymous")
    gw = await asyncio.to_thread(
        launch, "gateway", "--service", "digits", "--replica", primary.url, "--backup", backup.url,
        "--health-interval-s", str(INTERVAL), "--allow-anonymous", "--front", front, env={"SCANFLOW_TOKEN": "tok"},
    )
    auth = {"Authorization": "Bearer tok"}
    stop, progress = asyncio.Event(), LoadResult()
    load = asyncio.create_task(closed_loop(gw.url, {"inputs": digits_rows[:1]}, 4, stop, progress))
    await wait_for(lambda: load.done() or progress.ok >= 50, 30, "50 answers from the primary")
    assert _state(gw.url)["routed_to"] == "primary"

    port = int(primary.url.rsplit(":", 1)[1])
    primary.popen.send_signal(signal.SIGKILL)
    primary.popen.wait(5)
    await wait_for(lambda: _state(gw.url)["routed_to"] == "backup", 5, "failover to the backup")
    before = progress.ok
    await wait_for(lambda: load.done() or progress.ok >= before + 50, 30, "50 answers from the backup")

    # The primary comes back on its address: traffic fails back once it is healthy.
    restarted = await asyncio.to_thread(
        launch, "replica", "--model-uri", digits_models["v1"], "--allow-anonymous", port=port
    )
    await wait_for(lambda: _state(gw.url)["routed_to"] == "primary", 10, "failback to the primary")
    before = progress.ok
    await wait_for(lambda: load.done() or progress.ok >= before + 50, 30, "50 answers after failback")

    # Explicit override, refused without the token.
    async with httpx.AsyncClient(timeout=10) as http:
        assert (await http.put(gw.url + "/admin/route", json={"to": "backup"})).status_code == 401
        assert (await http.put(gw.url + "/admin/route", json={"to": "sideways"}, headers=auth)).status_code == 422
        assert (await http.put(gw.url + "/admin/route", json={"to": "backup"}, headers=auth)).status_code == 200
        forced = await http.post(gw.url + "/predict", json={"inputs": digits_rows[:1]})
        assert forced.json()["model_version"] == "2" and forced.headers["x-scanflow-upstream"] == backup.url
        await http.put(gw.url + "/admin/route", json={"to": "auto"}, headers=auth)
    stop.set()
    result = await load
    assert result.failures == []
    versions = [resp["model_version"] for resp in result.per_client[0]]
    # primary (v1) -> backup (v2) -> primary again (v1), each phase non-empty
    phases = [v for i, v in enumerate(versions) if i == 0 or v != versions[i - 1]]
    assert phases[:3] == ["1", "2", "1"]
    counts = _state(gw.url)["counts"]
    assert counts["failovers"] >= 1 and counts["failbacks"] >= 1
    assert restarted.popen.poll() is None
