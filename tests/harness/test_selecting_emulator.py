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

from tests.harness.cluster import REQUESTS_KEPT, _selecting_emulator, install_list_merge


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
            box["emulator"] = emulator
            ready.set()
            await box["stop"].wait()

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(30), "kmock did not start"
    cfg = kubernetes.client.Configuration()
    cfg.host = f"http://127.0.0.1:{port}"
    with kubernetes.client.ApiClient(cfg) as api:
        client = kubernetes.client.CoreV1Api(api)
        client.emulator = box["emulator"]
        yield client
    box["loop"].call_soon_threadsafe(box["stop"].set)
    thread.join(10)


def test_list_calls_honour_the_label_selector(core: Any) -> None:
    for name, service in (("digits-a", "digits"), ("checker-a", "checker"), ("digits-b", "digits")):
        core.create_namespaced_pod("scanflow", {
            "apiVersion": "v1", "kind": "Pod", "spec": {"containers": []},
            "metadata": {"name": name, "namespace": "scanflow", "labels": {"scanflow.io/service": service}}})
    names = lambda items: sorted(p.metadata.name for p in items)
    assert names(core.list_namespaced_pod("scanflow", label_selector="scanflow.io/service=digits").items) == [
        "digits-a", "digits-b"]
    assert names(core.list_namespaced_pod("scanflow", label_selector="scanflow.io/service notin (digits)").items) == [
        "checker-a"]
    assert len(core.list_namespaced_pod("scanflow").items) == 3  # no selector: every pod
    with pytest.raises(kubernetes.client.ApiException) as err:
        core.list_namespaced_pod("scanflow", label_selector="scanflow.io/service in digits")
    assert err.value.status == 400


def test_the_request_history_stays_bounded(core: Any) -> None:
    """kmock walks its whole request history to answer each request: the harness keeps it short, so
    a long run's API server does not slow down (objects, not requests, are what the harness reads)."""
    core.create_namespaced_pod("scanflow", {"apiVersion": "v1", "kind": "Pod", "spec": {"containers": []},
                                            "metadata": {"name": "p", "namespace": "scanflow"}})
    for _ in range(3 * REQUESTS_KEPT):
        assert core.read_namespaced_pod("p", "scanflow").metadata.name == "p"
    assert len(core.emulator._requests) <= 2 * REQUESTS_KEPT + 1
    assert [p.metadata.name for p in core.list_namespaced_pod("scanflow").items] == ["p"]


def test_a_spec_change_bumps_the_generation_as_an_api_server_does(core: Any) -> None:
    """kmock alone never moves metadata.generation, so a client waiting for observedGeneration to
    catch up took the previous rollout's status for the new one."""
    apps = kubernetes.client.AppsV1Api(core.api_client)
    core.emulator.resources["apps/v1/deployments"] = {}
    dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": "scanflow"},
           "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "d"}},
                    "template": {"metadata": {"labels": {"app": "d"}},
                                 "spec": {"containers": [{"name": "c", "image": "a"}]}}}}
    apps.create_namespaced_deployment("scanflow", dep)
    gen = lambda: apps.read_namespaced_deployment("d", "scanflow").metadata.generation or 1
    first = gen()
    apps.patch_namespaced_deployment("d", "scanflow", {"spec": {"replicas": 2}})
    assert gen() == first + 1
    apps.patch_namespaced_deployment("d", "scanflow", {"status": {"observedGeneration": first + 1}})
    apps.patch_namespaced_deployment("d", "scanflow", {"spec": {"replicas": 2}})  # no change: no bump
    assert gen() == first + 1


def test_named_lists_merge_by_name_except_in_a_json_merge_patch(core: Any) -> None:
    """A strategic merge patch merges `containers` and `env` by name; a JSON merge patch replaces the
    list whole, as on a real server (a rollback sends the old containers that way, and an env entry
    the old template lacked must go)."""
    from kmock._internal import dicts

    original = install_list_merge()
    try:
        apps = kubernetes.client.AppsV1Api(core.api_client)
        core.emulator.resources["apps/v1/deployments"] = {}
        old = [{"name": "c", "image": "a", "env": [{"name": "A", "value": "1"}]}]
        apps.create_namespaced_deployment("scanflow", {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "m", "namespace": "scanflow"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "m"}},
                     "template": {"metadata": {"labels": {"app": "m"}}, "spec": {"containers": old}}}})
        apps.patch_namespaced_deployment("m", "scanflow", {"spec": {"template": {"spec": {"containers": [
            {"name": "c", "env": [{"name": "B", "value": "2"}]}]}}}},
            _content_type="application/strategic-merge-patch+json")
        read = lambda: apps.api_client.sanitize_for_serialization(
            apps.read_namespaced_deployment("m", "scanflow").spec.template.spec.containers)
        assert [(c["name"], c["image"], [e["name"] for e in c["env"]]) for c in read()] == [("c", "a", ["A", "B"])]
        apps.patch_namespaced_deployment("m", "scanflow", {"spec": {"template": {"spec": {"containers": old}}}},
                                         _content_type="application/merge-patch+json")
        assert [(c["name"], [e["name"] for e in c["env"]]) for c in read()] == [("c", ["A"])]
    finally:
        dicts.patch_dict = original
