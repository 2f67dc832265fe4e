"""The replica's TrackerSink against a real Tracker-like agent over HTTP on loopback: batches are capped
by encoded bytes and split on 413 (nothing dropped that fits); 401/403 keep the records; 400/422 drop
them, counted. The app body limit comes from the agent (`Agent(max_body_bytes=)`)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from scanflow.agent import Agent, Store, create_app
from scanflow.serving.sink import TrackerSink
from scanflow.settings import Settings
from scanflow.tracking.api import MAX_BODY_BYTES, predictions_router
from scanflow.tracking.predictions import PredictionLog

TOKEN = "sink-test-token"


@asynccontextmanager
async def tracker(tmp_path: Path, port: int, router_limit: int, app_limit: int | None) -> AsyncIterator[PredictionLog]:
    """A real agent app with the predictions router, served by uvicorn on 127.0.0.1:port."""
    log = PredictionLog(f"sqlite:///{tmp_path / 'pred.db'}", name="w")
    store = Store(f"sqlite:///{tmp_path / 'agent.db'}")
    agent = Agent("tracker", role="tracker", max_body_bytes=app_limit)
    agent.router.include_router(predictions_router(log, TOKEN, max_body_bytes=router_limit))
    server = uvicorn.Server(uvicorn.Config(create_app(agent, Settings(token=TOKEN), store=store),
                                           host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve())
    try:
        await _until(lambda: _true(server.started or task.done()), 10, "the tracker to start")
        if task.done():
            task.result()
        yield log
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        store.close()
        log.close()


async def _true(v: bool) -> bool:
    return v


async def _until(cond: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if await cond():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def _rec(width: int = 64) -> dict[str, Any]:
    return {"request_id": uuid.uuid4().hex, "service": "s", "inputs": [[0.123456789] * width], "outputs": [1],
            "model_version": "1", "latency_ms": 1.0, "ts": 1.0, "record_id": uuid.uuid4().hex}


@asynccontextmanager
async def sink(port: int, token: str = TOKEN, **kw: Any) -> AsyncIterator[TrackerSink]:
    s = TrackerSink(f"http://127.0.0.1:{port}", token=token, flush_interval_s=0.02,
                    backoff_initial_s=0.02, backoff_max_s=0.1, **kw)
    s.start()
    try:
        yield s
    finally:
        await s.stop(flush_timeout_s=2.0)


async def test_a_batch_over_the_tracker_limit_is_split_and_nothing_is_lost(tmp_path: Path, port: int) -> None:
    async with tracker(tmp_path, port, router_limit=150_000, app_limit=MAX_BODY_BYTES) as log:
        async with sink(port) as s:  # 500 records of ~1.2 KB: ~600 KB per batch, 4x the limit
            for _ in range(500):
                s.record(_rec())
            await _until(lambda: _true(s.pending == 0), 20, "the sink to drain")
            assert (s.stats.sent, s.stats.dropped) == (500, 0)
            assert s._learnt_max_bytes is not None and s._learnt_max_bytes <= 150_000
        assert log.stats().stored == 500


async def test_a_single_record_over_the_limit_is_refused_alone(tmp_path: Path, port: int) -> None:
    async with tracker(tmp_path, port, router_limit=100_000, app_limit=None) as log:
        async with sink(port) as s:
            s.record(_rec())
            s.record(_rec(width=10_000))  # ~120 KB on its own
            s.record(_rec())
            await _until(lambda: _true(s.pending == 0), 20, "the sink to drain")
            assert (s.stats.sent, s.stats.dropped) == (2, 1)
        assert log.stats().stored == 2


async def test_batches_are_capped_by_bytes_before_sending(tmp_path: Path, port: int) -> None:
    async with tracker(tmp_path, port, router_limit=200_000, app_limit=None) as log:
        async with sink(port, max_batch_bytes=100_000) as s:
            for _ in range(300):
                s.record(_rec())
            await _until(lambda: _true(s.pending == 0), 20, "the sink to drain")
            assert s._learnt_max_bytes is None  # never refused: every batch was under the cap
            assert (s.stats.sent, s.stats.dropped) == (300, 0)
        assert log.stats().stored == 300


async def test_the_agent_raises_its_app_body_limit_for_its_router(tmp_path: Path, port: int) -> None:
    body = b"[" + b",".join(httpx.Request("POST", "/", json=_rec(100)).content for _ in range(900)) + b"]"
    assert 1 << 20 < len(body) < MAX_BODY_BYTES
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    url = f"http://127.0.0.1:{port}/predictions"
    async with (tracker(tmp_path / "a", port, router_limit=MAX_BODY_BYTES, app_limit=None),
                httpx.AsyncClient(timeout=10) as c):  # the default 1 MiB app limit refuses it
        r = await c.post(url, content=body, headers=headers)
        assert r.status_code == 413 and "larger than 1048576" in r.text
    async with (tracker(tmp_path / "b", port, router_limit=MAX_BODY_BYTES, app_limit=MAX_BODY_BYTES) as log,
                httpx.AsyncClient(timeout=10) as c):
        r = await c.post(url, content=body, headers=headers)
        assert r.status_code == 200 and r.json()["stored"] == 900, r.text
        assert log.stats().stored == 900


async def test_a_rejected_token_keeps_the_records_and_malformed_ones_are_dropped(tmp_path: Path, port: int) -> None:
    async with tracker(tmp_path, port, router_limit=MAX_BODY_BYTES, app_limit=None) as log:
        async with sink(port, token="wrong-token") as s:
            for _ in range(5):
                s.record(_rec())
            await _until(lambda: _true(s.stats.auth_rejected >= 2), 10, "two rejected sends")
            assert (s.pending, s.stats.dropped, s.stats.sent) == (5, 0, 0)
        async with sink(port) as good:  # the right token (the operator fixed the config); a bad record
            bad = _rec()
            del bad["service"]
            good.record(bad)
            await _until(lambda: _true(good.pending == 0), 10, "the malformed batch to be dropped")
            assert (good.stats.dropped, good.stats.sent) == (1, 0)
        assert log.stats().stored == 0
