"""KubernetesPlatform.set_challenger: kmock plays the API server (the gateway's pods, the challenger's
Deployment and Service); the gateways are real gateway processes on loopback, standing for the pods of
`digits-gateway` (each kmock pod names 127.0.0.1 and its process's port as its `http` port).

What kmock cannot show, a cluster's pod network and DNS, is left out: the challenger's URL (its Service's
cluster name) does not resolve here, so the gateways hold it as unhealthy, which is enough to read what the
Executor set on each of them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from scanflow.platform.base import PlatformError
from scanflow.platform.processes import free_port
from scanflow.spec import Service

pytestmark = pytest.mark.integration
NS = "scanflow"
TOKEN = "executor-token-for-gateways"
CHAMPION = Service(name="digits", model_uri="models:/digits@champion", replicas=1)
CHALLENGER = Service(name="digits-challenger", model_uri="models:/digits/7", replicas=1)


class Gateway:
    """One real gateway process (`python -m scanflow.serving.gateway`) on a fixed port."""

    def __init__(self, port: int, log: Path) -> None:
        self.port, self.url, self.log = port, f"http://127.0.0.1:{port}", log
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as fh:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "scanflow.serving.gateway", "--port", str(self.port), "--service", "digits",
                 "--replica", "http://127.0.0.1:9", "--health-interval-s", "60"],
                stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, "SCANFLOW_TOKEN": TOKEN})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until it answers (its start takes longer on a busy machine)
            assert self.popen.poll() is None, self.log.read_text()[-2000:]
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(self.log.read_text()[-2000:])

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)

    def challenger(self) -> dict[str, Any] | None:
        got: dict[str, Any] | None = httpx.get(self.url + "/admin/state", timeout=10).json()["challenger"]
        return got


@pytest.fixture
def gateways(tmp_path: Path) -> Iterator[list[Gateway]]:
    gws = [Gateway(free_port(), tmp_path / f"gateway-{i}.log") for i in range(3)]
    try:
        for g in gws:
            g.start()
        yield gws
    finally:
        for g in gws:
            g.stop()


def add_gateway_pod(plat: Any, name: str, port: int, *, ready: bool = True, app: str = "digits-gateway") -> None:
    plat.core.create_namespaced_pod(NS, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS,
                     "labels": {"app.kubernetes.io/name": app, "app.kubernetes.io/component": "gateway"}},
        "spec": {"containers": [{"name": "gateway", "image": "scanflow:0.1.0",
                                 "ports": [{"name": "http", "containerPort": port}]}]},
        "status": {"podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    })


def test_the_challenger_goes_on_every_ready_gateway_pod_and_back_on_a_restarted_one(  # type: ignore[no-untyped-def]
        make_platform, gateways) -> None:
    plat = make_platform(gateway_token=TOKEN)
    with pytest.raises(PlatformError, match="no pod of its gateway") as none:  # nowhere to split: refused first
        plat.set_challenger("digits", None)
    assert none.value.retryable is False
    plat.deploy(CHAMPION)
    plat.deploy(CHALLENGER)
    g1, g2, starting = gateways
    add_gateway_pod(plat, "digits-gateway-a", g1.port)
    add_gateway_pod(plat, "digits-gateway-b", g2.port)
    add_gateway_pod(plat, "digits-gateway-new", starting.port, ready=False)  # not Ready: no traffic, not set
    add_gateway_pod(plat, "other-gateway-a", free_port(), app="other-gateway")  # another service's gateway

    delivery = "digits:v7@1700000000.000"
    plat.set_challenger("digits", "digits-challenger", "shadow", 1.0, delivery)
    first = [g.challenger() for g in (g1, g2)]
    assert starting.challenger() is None
    for ch in first:
        assert ch is not None
        assert (ch["url"], ch["service"], ch["mode"], ch["share"], ch["delivery"]) == (
            "http://digits-challenger.scanflow.svc:8080", "digits-challenger", "shadow", 1.0, delivery)

    # a gateway pod restarts: it comes back without a challenger; the Executor's repeat gives it back, and
    # changes nothing on the other (its figures keep counting from when it was set)
    g2.stop()
    g2.start()
    assert g2.challenger() is None
    plat.set_challenger("digits", "digits-challenger", "shadow", 1.0, delivery)
    again = g1.challenger()
    assert again is not None and again["since"] == first[0]["since"]  # type: ignore[index]
    assert (g2.challenger() or {}).get("delivery") == delivery

    plat.set_challenger("digits", "digits-challenger", "canary", 0.1, delivery)
    assert [(g.challenger() or {}).get("mode") for g in gateways] == ["canary", "canary", None]
    plat.set_challenger("digits", None)  # taken off every pod, Ready or not
    assert [g.challenger() for g in gateways] == [None, None, None]


def test_a_wrong_token_or_an_undeployed_challenger_is_refused_with_its_reason(  # type: ignore[no-untyped-def]
        make_platform, gateways) -> None:
    add_gateway_pod(make_platform(), "digits-gateway-a", gateways[0].port)
    wrong = make_platform(gateway_token="not-the-token")
    wrong.deploy(CHAMPION)
    wrong.deploy(CHALLENGER)
    with pytest.raises(PlatformError, match="not set on 1 of 1 gateway pods") as err:
        wrong.set_challenger("digits", "digits-challenger", "shadow", 1.0, "d")
    assert "401" in str(err.value) and "serving:admin" in str(err.value) and "not-the-token" not in str(err.value)
    assert err.value.retryable is False  # a refused token does not heal by itself
    assert gateways[0].challenger() is None
    right = make_platform(gateway_token=TOKEN)
    with pytest.raises(PlatformError, match="digits-later"):  # its Deployment is not there: nothing to split to
        right.set_challenger("digits", "digits-later", "shadow", 1.0, "d")
    assert gateways[0].challenger() is None
