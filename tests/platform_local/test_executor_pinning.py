"""The Planner's pinning plan applied by the Executor's `set_resources` to a real replica process on the
LocalPlatform, read back from /proc before it reports success: pinned to the CPUMEM cores at a whole
core, unpinned again (every core its cpuset allows) at a fractional size."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from scanflow.agent import PermanentError
from scanflow.platform.topology import parse_cpu_list
from scanflow.policies import elastic, pinning
from scanflow.spec import Resources, Service
from scanflow.standard import executor
from scanflow.standard.planner import plan_resources

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _allowed(pid: int) -> set[tuple[int, ...]]:
    """Cpus_allowed_list of every thread of the process, as the kernel reports it."""
    out = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                out.add(parse_cpu_list(line.split(":", 1)[1]))
    return out


def _execute(plan: dict[str, Any], platform: Any) -> dict[str, Any]:
    """The Executor's set_resources on `platform`, reading back for up to 15 s."""
    ctx = SimpleNamespace(event=None, key="k", resources={"platform": platform},
                          spec=SimpleNamespace(settings={"readback_s": 15.0}))
    return executor.set_resources(ctx, plan)  # type: ignore[arg-type]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning keeps a core in reserve: needs 2 cores")
def test_the_executor_pins_a_real_replica_and_reads_it_back(platform, models) -> None:  # type: ignore[no-untyped-def]
    cores = tuple(sorted(os.sched_getaffinity(0)))
    svc = Service(name="pin", model_uri=models["v1"], resources=Resources(cpu=0.5, memory="1Gi"))
    pid = platform.deploy(svc).replicas[0].pid
    assert _allowed(pid) == {cores}  # unpinned: every core this process may use
    on = pinning.PinConfig(mode="pinned")

    # the Planner grows the replica to one whole core on this node: the plan pins it (CPUMEM: core 0 of
    # the first socket), the Executor applies it and reports success only after reading it back
    grow = elastic.ElasticDecision("grow", replicas=1, cpu=1.0, threads=1, action="grow")
    plan, pin = plan_resources(svc, grow, 0.5, 1, float(len(cores)), on, "none", "k1")
    assert plan is not None and pin.affinity == "pinned", pin.reason
    first = platform.topology.sockets[0][0]
    if platform.cgroup_support.usable:
        out = _execute(plan, platform)
        assert out["verified"] is True and out["applied"]["pin-1"]["cpus"] == [first]
        assert out["observed"]["pin-1"]["cpus"] == [first] and out["observed"]["pin-1"]["cpu_quota"] == 1.0
    else:  # the quota cannot be applied here: the step fails, and only on the quota (the cores did move)
        with pytest.raises(PermanentError, match="CPU quota") as err:
            _execute(plan, platform)
        assert "allowed cores" not in str(err.value)
    assert _allowed(pid) == {(first,)}  # every thread, straight from /proc

    # shrunk to a fractional size: the plan unpins (and says why), the replica may use every core again
    shrink = elastic.ElasticDecision("shrink", replicas=1, cpu=0.75, threads=1, action="shrink")
    plan, pin = plan_resources(svc, shrink, 1.0, 1, float(len(cores)), on, "pinned", "k2")
    assert plan is not None and plan["affinity"]["policy"] == "none" and "not a whole number" in plan["reason"]
    if platform.cgroup_support.usable:
        out = _execute(plan, platform)
        assert out["verified"] is True and out["observed"]["pin-1"]["cpus"] == list(cores)
    else:
        with pytest.raises(PermanentError, match="CPU quota"):
            _execute(plan, platform)
    assert _allowed(pid) == {cores}
    assert platform.status("pin").replicas[0].pid == pid  # applied in place: the same process throughout
