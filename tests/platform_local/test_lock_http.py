"""The platform's lock is never held across a public call's HTTP requests (review finding 2).

A replica's /admin/threads (set_resources) or the gateway's /admin/route (route) is made to hang
until the test releases it; meanwhile a SIGKILLed replica must be restarted by the supervisor and
status() must answer. With the lock held across the request, both would wait for the hang to end.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from plat_load import wait_for  # type: ignore[import-not-found]

from scanflow.platform import processes as procs
from scanflow.spec import Resources, Service

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@contextmanager
def hang(monkeypatch: pytest.MonkeyPatch, method: str, path: str) -> Iterator[tuple[threading.Event, threading.Event]]:
    """procs.call blocks on `method path` until `release` is set; `entered` tells it got there."""
    entered, release = threading.Event(), threading.Event()
    real: Callable[..., Any] = procs.call

    def call(m: str, url: str, **kw: Any) -> Any:
        if m == method and url.endswith(path):
            entered.set()
            release.wait(60)
        return real(m, url, **kw)

    monkeypatch.setattr(procs, "call", call)
    try:
        yield entered, release
    finally:
        release.set()


def _restarted_while_hung(platform: Any, name: str, run: Callable[[], Any], entered: threading.Event) -> Any:
    """Start `run` in a thread, wait until it hangs in HTTP, SIGKILL replica 2 and check that the
    supervisor restarts it and status() answers before the hang ends. Returns the thread's box."""
    box: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: box.update(result=run()), daemon=True)
    worker.start()
    assert entered.wait(30), "the public call never reached its HTTP request"
    victim = next(r.pid for r in platform.status(name).replicas if r.name == f"{name}-2")  # answers: lock free
    os.kill(victim, signal.SIGKILL)

    def restarted() -> bool:
        pid = next(r.pid for r in platform.status(name).replicas if r.name == f"{name}-2")
        return pid is not None and pid != victim

    assert wait_for(restarted, 30), "the supervisor did not restart the killed replica while the call waited on HTTP"
    assert worker.is_alive()  # still hung: the restart did not wait for it
    return worker, box


def test_supervisor_and_status_run_while_calls_wait_on_http(platform, models, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    spec = Service(name="locks", model_uri=models["v1"], replicas=2, max_replicas=3,
                   resources=Resources(cpu=1, memory="1Gi"))
    platform.deploy(spec)
    platform.deploy(Service(name="locks-spare", model_uri=models["v1"], resources=Resources(cpu=1, memory="1Gi")))

    with hang(monkeypatch, "POST", "/admin/threads") as (entered, release):
        worker, box = _restarted_while_hung(
            platform, "locks", lambda: platform.set_resources("locks", Resources(cpu=1, memory="1Gi")), entered)
        release.set()
        worker.join(60)
    assert box["result"].service == "locks"
    assert wait_for(lambda: platform.status("locks").ready_replicas == 2, 90, 0.5)

    with hang(monkeypatch, "PUT", "/admin/route") as (entered, release):
        worker, box = _restarted_while_hung(platform, "locks", lambda: platform.route("locks", "locks-spare"), entered)
        assert platform.status("locks").routed_to == "locks"  # recorded only once the gateway accepted it
        release.set()
        worker.join(60)
    assert box["result"].routed_to == "locks-spare"
    assert platform.services()["locks"].replicas == 2
