"""Helpers of the agent-area tests: the token, an in-process app with its lifespan, waits, agent
processes. A module of its own name: `from conftest import` is ambiguous when several test folders
have a conftest (pytest imports each as `conftest`; whichever came first wins).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from scanflow.agent import Agent, Store, create_app
from scanflow.platform.processes import free_port
from scanflow.settings import Settings

TOKEN = "test-token-123"
HERE = Path(__file__).parent


@asynccontextmanager
async def running(agent: Agent, store: Store, **kw: Any) -> AsyncIterator[httpx.AsyncClient]:
    """The agent's app with its lifespan running, and an authorised client talking to it in-process."""
    kw.setdefault("retry_backoff_s", 0.01)
    settings = kw.pop("settings", None) or Settings(token=TOKEN)
    app = create_app(agent, settings, store=store, **kw)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://agent", headers={"Authorization": f"Bearer {TOKEN}"}
        ) as client:
            client.app = app  # type: ignore[attr-defined]
            yield client


async def wait_for(
    cond: Callable[[], Awaitable[bool]], timeout: float = 10.0, what: str = "condition"
) -> None:
    """Poll an async condition until true or fail after `timeout` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if await cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


async def drained(client: httpx.AsyncClient, timeout: float = 10.0) -> None:
    async def empty() -> bool:
        return (await client.get("/events", params={"status": "pending"})).json() == []

    await wait_for(empty, timeout, "the inbox to drain")


class AgentProcess:
    """`scanflow agent run FILE --name NAME` as a real OS process on a loopback port."""

    def __init__(
        self, file: Path, name: str, port: int, home: Path, env: dict[str, str], args: list[str]
    ) -> None:
        self.file, self.name, self.port, self.home = file, name, port, home
        self.env, self.args = env, args
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = home / f"{name}.log"

    def start(self) -> AgentProcess:
        env = {**os.environ, **self.env, "SCANFLOW_HOME": str(self.home), "SCANFLOW_LOG_LEVEL": "WARNING"}
        cmd = [
            sys.executable,
            "-m",
            "scanflow.cli",
            "agent",
            "run",
            str(self.file),
            "--name",
            self.name,
            "--port",
            str(self.port),
            *self.args,
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"agent {self.name} exited {self.proc.returncode}:\n{self.log_path.read_text()}"
                )
            try:
                if httpx.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"agent {self.name} not ready in {timeout}s:\n{self.log_path.read_text()}")

    def kill(self) -> None:
        """SIGKILL: no shutdown hooks, no flush; what the store holds is all that survives."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


free_port_for = free_port  # a free loopback port for the process tests
