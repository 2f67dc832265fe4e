"""The Executor's `set_resources` reports a resources plan as done only once the platform's status shows
what the plan asked for (read back), and says what differs otherwise."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from scanflow.agent import PermanentError
from scanflow.platform.base import ReplicaStatus, ResourceChange, ServiceStatus
from scanflow.platform.readback import Wanted
from scanflow.standard import executor


class FakePlatform:
    """Applies nothing by itself: `status()` shows `shown` (one per call, the last one repeated)."""

    def __init__(self, shown: list[ReplicaStatus], wanted: Wanted | None) -> None:
        self.shown = shown
        self.wanted = wanted
        self.calls: list[tuple[Any, ...]] = []

    def set_resources(self, service: str, resources: Any, affinity: Any, threads: Any) -> ResourceChange:
        self.calls.append((service, resources.cpu, affinity, threads))
        return ResourceChange(service, "affinity+cgroup", {"cpu": resources.cpu}, ("a note",), self.wanted)

    def status(self, service: str) -> ServiceStatus:
        rep = self.shown.pop(0) if len(self.shown) > 1 else self.shown[0]
        return ServiceStatus(service, 1, (rep,))


def _run(monkeypatch: pytest.MonkeyPatch, plat: FakePlatform, **plan: Any) -> dict[str, Any]:
    ctx = SimpleNamespace(event=None, key="k", resources={"platform": plat},
                          spec=SimpleNamespace(settings={"readback_s": 1.0}))
    body = {"service": "digits", "resources": {"cpu": 0.3, "memory": "512Mi"}, "threads": 1, **plan}
    return executor.set_resources(ctx, body)  # type: ignore[arg-type]


WANT = Wanted(cpu_quota=0.3, memory_limit=512 * 2**20, cpus={"digits-1": (1,)}, replica_threads={"digits-1": 1})
GOOD = ReplicaStatus("digits-1", True, cpus=(1,), cpu_quota=0.3, memory_limit=512 * 2**20, threads=1)


def test_success_only_after_the_replica_shows_the_change(monkeypatch: pytest.MonkeyPatch) -> None:
    old = ReplicaStatus("digits-1", True, cpus=(0, 1), cpu_quota=1.0, memory_limit=512 * 2**20, threads=2)
    plat = FakePlatform([old, old, GOOD], WANT)  # the first reads still show the old settings
    out = _run(monkeypatch, plat)
    assert out["verified"] is True and out["observed"]["digits-1"]["cpu_quota"] == 0.3
    assert "wanted" not in out and out["method"] == "affinity+cgroup"
    assert plat.calls == [("digits", 0.3, None, 1)]


def test_a_change_that_did_not_take_effect_fails_and_says_what(monkeypatch: pytest.MonkeyPatch) -> None:
    refused = ReplicaStatus("digits-1", True, cpus=(1,), cpu_quota=None, memory_limit=None, threads=1)
    with pytest.raises(PermanentError, match=r"read back differs: digits-1: CPU quota unlimited, wanted 0.3 cores"):
        _run(monkeypatch, FakePlatform([refused], WANT))


def test_bad_plans_are_refused_before_anything_is_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    plat = FakePlatform([GOOD], WANT)
    for bad in ({"threads": 0}, {"threads": True}, {"resources": {"cpu": -1}}, {"service": None, "resources": None}):
        with pytest.raises(PermanentError, match="set_resources"):
            _run(monkeypatch, plat, **bad)
    assert plat.calls == []


def test_a_platform_that_cannot_say_what_to_read_back_fails_the_step_and_says_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    plat = FakePlatform([GOOD], None)
    with pytest.raises(PermanentError, match=r"applied \(affinity\+cgroup\) but NOT verified: the platform "
                                             r"FakePlatform did not say.*\(notes: a note\)"):
        _run(monkeypatch, plat)
    assert plat.calls == [("digits", 0.3, None, 1)]  # it was applied: the failure says what is unknown
