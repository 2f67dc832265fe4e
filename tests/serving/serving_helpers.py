"""Helpers for the serving tests (imported by conftest.py and the test modules): free ports, our
server processes, a closed-loop load (scanflow.loadgen_engine) and a poll-until helper."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from scanflow.loadgen_engine import Engine, Outcome
from scanflow.loadgen_http import Request
from scanflow.platform.processes import free_port  # noqa: F401 - re-exported for the serving tests


@dataclass
class Proc:
    """A server process of ours; `url` is its base URL."""

    popen: subprocess.Popen[bytes]
    url: str
    log: Path

    def wait_ready(self, path: str = "/ready", timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"process exited {self.popen.returncode}: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(self.url + path, timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{self.url}{path} not ready in {timeout_s}s: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)


# --- closed-loop load from the test process ---------------------------------------------------


@dataclass
class LoadResult:
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    per_client: list[list[dict]] = field(default_factory=list)  # responses (json + upstream), in order

    @property
    def responses(self) -> list[dict]:
        return [r for c in self.per_client for r in c]


async def closed_loop(
    url: str, body: dict, clients: int, stop: asyncio.Event, result: LoadResult | None = None
) -> LoadResult:
    """`clients` concurrent clients, each sending its next request when the previous one answered (the
    load generator's engine, on the test's event loop).

    Pass `result` to watch progress (result.ok) while the load runs.
    """
    result = result or LoadResult()
    result.per_client = [[] for _ in range(clients)]
    content = orjson.dumps(body)

    def answered(req: Request, out: Outcome) -> bool:
        r = out.response
        if r is None:
            result.failures.append(f"{type(out.error).__name__}: {out.error}")
            return False
        if r.status_code != 200:
            result.failures.append(f"HTTP {r.status_code}: {r.text[:200]}")
            return True
        result.ok += 1
        result.per_client[req.meta].append({**r.json(), "upstream": r.headers.get("x-scanflow-upstream")})
        return True

    engine = Engine(url + "/predict", lambda c, n: Request(content, meta=c), answered, clients=clients,
                    timeout_s=10.0, concurrency=clients, error_pause_s=0.0)
    await engine.run(stop.is_set)
    return result


async def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Poll `predicate` until true; returns the seconds it took; fails the test after `timeout_s`."""
    t0 = time.monotonic()
    while not predicate():
        if time.monotonic() - t0 > timeout_s:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.02)
    return time.monotonic() - t0


async def read_body(receive: Any) -> bytes:
    """An ASGI request's whole body (stand-in servers in tests read it the way a real app does)."""
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            return body


def record_asgi_paths(app: Any) -> list[str]:
    """Wrap a gateway app's ASGI side so every HTTP path it handles is appended to the returned list:
    what the fast front answered itself never shows up there."""
    seen: list[str] = []
    plain_api = app.api

    async def counted(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            seen.append(scope["path"])
        await plain_api(scope, receive, send)

    app.api = counted
    return seen
