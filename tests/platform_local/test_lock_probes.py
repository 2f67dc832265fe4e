"""The supervisor's readiness probes and deploy's health wait never hold the platform's lock.

A new service's gateway /health is made to hang until the test releases it: deploy() waits on it,
and that service's supervisor tick probes it (before its replicas' /ready). Meanwhile another service
must stay fully managed: status() answers and its SIGKILLed replica is restarted by the supervisor.
With a probe under the lock (or one supervisor thread ticking every service in turn), both would
wait for the hang to end.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any

import pytest
from plat_load import wait_for  # type: ignore[import-not-found]

from scanflow.platform import processes as procs
from scanflow.spec import Resources, Service

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_hung_probe_of_one_service_stalls_neither_status_nor_supervision_of_another(
    platform, models, monkeypatch  # type: ignore[no-untyped-def]
) -> None:
    res = Resources(cpu=1, memory="1Gi")
    platform.deploy(Service(name="steady", model_uri=models["v1"], replicas=1, resources=res))
    port = procs.free_port()
    slow = f"http://127.0.0.1:{port}"  # the new service's gateway

    entered, release = threading.Event(), threading.Event()
    real: Callable[..., bool] = procs.is_ready

    def is_ready(url: str, timeout_s: float = 2.0) -> bool:
        if url.startswith(slow):  # deploy's health wait and the new service's tick hang here
            entered.set()
            release.wait(120)
        return real(url, timeout_s)

    monkeypatch.setattr(procs, "is_ready", is_ready)
    box: dict[str, Any] = {}
    deployer = threading.Thread(
        target=lambda: box.update(result=platform.deploy(Service(name="slowgw", model_uri=models["v1"], resources=res, port=port))),
        daemon=True,
    )
    try:
        deployer.start()
        assert entered.wait(60), "no probe of the new service ever started"

        answered: dict[str, Any] = {}
        asker = threading.Thread(target=lambda: answered.update(st=platform.status("steady")), daemon=True)
        asker.start()
        asker.join(30)
        assert "st" in answered, "status() of another service waited for a hung probe"
        assert not release.is_set() and deployer.is_alive()  # the probe was still in flight

        victim = answered["st"].replicas[0].pid
        os.kill(victim, signal.SIGKILL)

        def restarted() -> bool:
            rep = platform.status("steady").replicas[0]
            return rep.ready and rep.pid not in (None, victim)

        assert wait_for(restarted, 90, 0.2), "the other service's supervision waited for the hung probe"
        assert deployer.is_alive()  # still hung: the restart did not wait for it
    finally:
        release.set()
        deployer.join(150)
    assert box["result"].ready_replicas == 1  # once released, the slow service comes up normally
    assert platform.status("steady").ready_replicas == 1
