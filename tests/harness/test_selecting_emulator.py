"""The emulated cluster's API server (kmock, tests/harness/cluster.py) filters list calls by their
`labelSelector` as an API server does: the official client asks for one service's pods and gets only
those; a selector it cannot parse is a 400. Emulation: kmock on loopback, no cluster."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest

from tests.harness.cluster import _selecting_emulator


@pytest.fixture
def core() -> Iterator[Any]:
    from kmock import Server

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    box: dict[str, Any] = {}
    ready = threading.Event()

    async def main() -> None:
        box["loop"], box["stop"] = asyncio.get_running_loop(), asyncio.Event()
        async with _selecting_emulator()() as emulator, Server(emulator, host="127.0.0.1", port=port):
            emulator.resources["v1/pods"] = {}
            ready.set()
            await box["stop"].wait()

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(30), "kmock did not start"
    cfg = kubernetes.client.Configuration()
    cfg.host = f"http://127.0.0.1:{port}"
    with kubernetes.client.ApiClient(cfg) as api:
        yield kubernetes.client.CoreV1Api(api)
    box["loop"].call_soon_threadsafe(box["stop"].set)
    thread.join(10)


def test_list_calls_honour_the_label_selector(core: Any) -> None:
    for name, service in (("digits-a", "digits"), ("checker-a", "checker"), ("digits-b", "digits")):
        core.create_namespaced_pod("scanflow", {
            "apiVersion": "v1", "kind": "Pod", "spec": {"containers": []},
            "metadata": {"name": name, "namespace": "scanflow", "labels": {"scanflow.io/service": service}}})
    names = lambda items: sorted(p.metadata.name for p in items)  # noqa: E731
    assert names(core.list_namespaced_pod("scanflow", label_selector="scanflow.io/service=digits").items) == [
        "digits-a", "digits-b"]
    assert names(core.list_namespaced_pod("scanflow", label_selector="scanflow.io/service notin (digits)").items) == [
        "checker-a"]
    assert len(core.list_namespaced_pod("scanflow").items) == 3  # no selector: every pod
    with pytest.raises(kubernetes.client.ApiException) as err:
        core.list_namespaced_pod("scanflow", label_selector="scanflow.io/service in digits")
    assert err.value.status == 400
