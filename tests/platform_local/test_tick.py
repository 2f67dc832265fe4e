"""The supervisor tick's apply step leaves alone what changed while it probed (no processes started:
the replicas here are this test process itself, watched by pid, and never probed for real)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scanflow.platform import processes as procs
from scanflow.platform.local import LocalPlatform
from scanflow.platform.local_state import _Replica, _Service
from scanflow.spec import Service


def _me() -> procs.Adopted:
    start = procs.start_time(os.getpid())
    assert start is not None
    return procs.Adopted(os.getpid(), start)


@pytest.fixture
def plat(tmp_path: Path):  # type: ignore[no-untyped-def]
    p = LocalPlatform(tmp_path / "home", tracking_uri="http://127.0.0.1:9")
    try:
        yield p
    finally:
        p._services.clear()  # nothing of ours to stop: the "processes" are this test
        p.close()


def test_a_replica_retired_or_replaced_during_the_probe_is_left_alone(plat: LocalPlatform) -> None:
    svc = _Service(spec=Service(name="t", model_uri="models:/m/1"), gateway=_me(), gateway_port=9)
    old, new = _Replica(rid=1, port=9, proc=_me()), _Replica(rid=1, port=10, proc=_me())
    retired = _Replica(rid=2, port=11, proc=_me())
    svc.replicas[1] = new  # slot 1 was replaced, slot 2 scaled away, while the probes ran
    with plat._lock:
        overdue = plat._supervisor.promote(svc, [(old, True), (retired, True)], now=1e9)
    assert overdue == []
    assert (old.state, new.state, retired.state) == ("starting", "starting", "starting")
    assert svc.notes == {}  # nothing placed or pinned


def test_a_deleted_service_is_not_ticked(plat: LocalPlatform, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_probe(*_a: object, **_k: object) -> bool:
        raise AssertionError("a deleted service was probed")

    monkeypatch.setattr(procs, "is_ready", no_probe)
    svc = _Service(spec=Service(name="gone", model_uri="models:/m/1"), gateway=_me(), gateway_port=9)
    svc.replicas[1] = _Replica(rid=1, port=9, proc=_me())
    assert plat._supervisor.tick(svc) is False  # never registered (or deleted): the supervisor thread ends
    plat._services["gone"] = svc
    plat._closed.set()  # what close() does first (close() itself would stop the "processes": this test)
    try:
        assert plat._supervisor.tick(svc) is False  # closed: nothing more happens either
    finally:
        plat._services.clear()


def test_a_gateway_whose_port_was_taken_while_it_was_down_waits_for_the_next_tick(
        plat: LocalPlatform, caplog: pytest.LogCaptureFixture) -> None:
    import logging
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        dead = procs.Adopted(os.getpid(), -1)  # a start time no process has: reads as exited
        svc = _Service(spec=Service(name="t", model_uri="models:/m/1"), gateway=dead, gateway_port=port)
        with caplog.at_level(logging.WARNING, logger="scanflow.platform.local_supervisor"), plat._lock:
            for tick in range(3):
                plat._supervisor.observe(svc, now=float(tick))  # no exception: the tick goes on with the replicas
        assert svc.gateway is dead  # not restarted on another port, nor spawned to fail its bind
        assert "not restarted yet" in svc.notes["gateway-restart"]  # status() says why while it lasts
        assert len([r for r in caplog.records if "not restarted yet" in r.getMessage()]) == 1  # once, not per tick
