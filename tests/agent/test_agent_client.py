"""AgentClient against a real HTTP server on loopback: what it retries, what it does not, deadlines."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import httpx
import pytest
import uvicorn
from agent_support import free_port_for
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from scanflow.agent import AgentClient, AgentHTTPError


def flaky_app(counts: dict[str, int]) -> Starlette:
    async def flaky(request: Request) -> JSONResponse:
        counts["flaky"] = counts.get("flaky", 0) + 1
        if counts["flaky"] <= 2:
            return JSONResponse({"detail": "busy"}, status_code=503)
        body = await request.json()
        return JSONResponse({"id": 1, "duplicate": False, "key": body["idempotency_key"]}, status_code=202)

    async def bad(request: Request) -> JSONResponse:
        counts["bad"] = counts.get("bad", 0) + 1
        return JSONResponse({"detail": "payload: Input should be a valid dictionary"}, status_code=422)

    async def down(request: Request) -> JSONResponse:
        counts["down"] = counts.get("down", 0) + 1
        return JSONResponse({"detail": "no"}, status_code=500)

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    return Starlette(
        routes=[
            Route("/events", flaky, methods=["POST"]),
            Route("/actuators/bad", bad, methods=["POST"]),
            Route("/actuators/down", down, methods=["POST"]),
            Route("/health", health),
        ]
    )


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, dict[str, int]]]:
    counts: dict[str, int] = {}
    port = free_port_for()
    srv = uvicorn.Server(uvicorn.Config(flaky_app(counts), host="127.0.0.1", port=port, log_level="error"))
    task = asyncio.create_task(srv.serve())
    try:
        async with AgentClient(f"http://127.0.0.1:{port}") as c:
            await c.wait_ready(10)
        yield f"http://127.0.0.1:{port}", counts
    finally:
        srv.should_exit = True
        await task


async def test_5xx_is_retried_with_the_same_idempotency_key(server: tuple[str, dict[str, int]]) -> None:
    url, counts = server
    async with AgentClient(url, "tok", retries=3, backoff_s=0.01) as c:
        r = await c.post_event("x", {"a": 1}, key="evt-1")
    assert counts["flaky"] == 3 and r["key"] == "evt-1"


async def test_4xx_is_not_retried_and_keeps_the_server_message(server: tuple[str, dict[str, int]]) -> None:
    url, counts = server
    async with AgentClient(url, retries=3, backoff_s=0.01) as c:
        with pytest.raises(AgentHTTPError) as info:
            await c.call_actuator("bad", {})
    assert counts["bad"] == 1
    assert info.value.status == 422 and not info.value.retryable
    assert "valid dictionary" in str(info.value)


async def test_retries_are_bounded(server: tuple[str, dict[str, int]]) -> None:
    url, counts = server
    async with AgentClient(url, retries=2, backoff_s=0.01) as c:
        with pytest.raises(AgentHTTPError) as info:
            await c.call_actuator("down", {})
    assert counts["down"] == 3 and info.value.retryable


async def test_connection_refused_is_retried_then_raised_and_wait_ready_has_a_deadline() -> None:
    dead = f"http://127.0.0.1:{free_port_for()}"
    async with AgentClient(dead, retries=1, backoff_s=0.01, timeout=1) as c:
        with pytest.raises(httpx.ConnectError):
            await c.health()
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="not ready"):
            await c.wait_ready(0.3)
        assert time.monotonic() - t0 < 5
