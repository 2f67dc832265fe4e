"""Fixtures of the Kubernetes area: kmock (the stateful Kubernetes emulator) on loopback, in a thread.

kmock is asyncio; the official client blocks. Running kmock's loop in its own thread lets the tests
call KubernetesPlatform exactly as the Executor does (synchronously, off any event loop) while the
emulator records every request (method, path, content type, body) for assertions.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes import client as k8s

from scanflow.platform.kubernetes import KubernetesPlatform

RESOURCES = ("v1/pods", "v1/services", "apps/v1/deployments", "batch/v1/jobs",
             "autoscaling/v2/horizontalpodautoscalers")


def version_info(minor: int) -> dict[str, str]:
    return {"major": "1", "minor": str(minor), "gitVersion": f"v1.{minor}.0", "gitCommit": "0" * 40,
            "gitTreeState": "clean", "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.24",
            "compiler": "gc", "platform": "linux/amd64"}


@dataclass
class KMock:
    """A running emulator: `emulator` takes reactions and holds objects; `url` is its address."""

    emulator: Any
    url: str
    _mark: int = field(default=0)

    def requests(self) -> list[Any]:
        """Every request received since the last `mark()`."""
        return list(self.emulator)[self._mark:]

    def mark(self) -> None:
        self._mark = len(list(self.emulator))

    def calls(self) -> list[tuple[str, str, str | None]]:
        """(METHOD, path, Content-Type) of each request since the mark, for exact assertions."""
        return [(str(r.method.value).upper(), r.url.path, r.headers.get("Content-Type")) for r in self.requests()]


@pytest.fixture
def kmock_server() -> Iterator[KMock]:
    from kmock import KubernetesEmulator, Server

    ready = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        box["loop"] = asyncio.get_running_loop()
        box["stop"] = asyncio.Event()
        async with KubernetesEmulator() as emulator, Server(emulator) as server:
            for res in RESOURCES:
                emulator.resources[res] = {}
            box["km"] = KMock(emulator, str(server.url).rstrip("/"))
            ready.set()
            await box["stop"].wait()

    thread = threading.Thread(target=asyncio.run, args=(main(),), name="kmock", daemon=True)
    thread.start()
    try:
        if not ready.wait(15):
            raise RuntimeError("kmock did not start within 15 s")
        yield box["km"]
    finally:
        if "loop" in box:
            box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join(10)


@pytest.fixture
def make_platform(kmock_server: KMock) -> Iterator[Callable[..., KubernetesPlatform]]:
    """Build a KubernetesPlatform on kmock that reports server version 1.<minor>."""
    made: list[KubernetesPlatform] = []

    def make(minor: int = 34, **kwargs: Any) -> KubernetesPlatform:
        kmock_server.emulator["get /version/"] << version_info(minor)
        cfg = k8s.Configuration()
        cfg.host = kmock_server.url
        options: dict[str, Any] = {"namespace": "scanflow", "ready_timeout_s": 0, "poll_interval_s": 0.02,
                                   "backoff_s": 0.01, "request_timeout_s": 5, "resize_timeout_s": 2}
        options.update(kwargs)
        plat = KubernetesPlatform(k8s.ApiClient(cfg), **options)
        made.append(plat)
        return plat

    yield make
    for plat in made:
        plat.close()
