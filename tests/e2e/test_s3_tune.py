"""S3 end to end through the agents: on a quick EmbeddedStack the demo's S3 scenario starts the digits
service mis-sized (0.1 of a core, one thread: set and read back through the Executor), loads it, and
turns the Planner's autoscale strategy (vertical-first) on; the Checker's observations make the Planner
grow the replica in place (a `resources` plan), the Executor applies it and reads it back, and the
measured throughput rises. A second case starts right-sized (where the first settled) under a load
that fits that size: the Planner looks and holds, nothing changes. Asserted from the agents' audit logs. Slow (a
stack start, then ~1.5 minutes). Skipped where cgroup CPU quotas cannot be applied."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(600)]


def test_s3_grows_a_mis_sized_replica_and_leaves_a_right_sized_one_alone(tmp_path: Path) -> None:
    import mlflow

    from scanflow.demo import s3_tune
    from scanflow.demo.common import DemoContext
    from scanflow.demo.runner import demo_workflow
    from scanflow.platform.cgroups import detect
    from scanflow.stack import EmbeddedStack

    if not detect().usable:
        pytest.skip(f"no cgroup CPU quota here ({detect().reason}): S3's mis-sized start cannot be applied")
    with EmbeddedStack(tmp_path / "stack", demo_workflow(), quick=True) as stack:
        mlflow.set_tracking_uri(stack.tracking_uri)
        res = s3_tune.run(DemoContext(tmp_path, stack.tracking_uri, quick=True, stack=stack))
        strategies = [s["name"] for s in stack.get("planner", "/strategies")]
        restored = stack.get("executor", "/services")["digits"]["replicas"]
    f = res.figures
    why = (f, res.decisions, res.error)
    print(f"S3: {why}")  # the whole record on failure (an assertion message is cut short)
    assert res.error is None, why
    # case 1: the Planner grew the replica from the observations, the Executor applied and read it back
    assert f["planner_moves"] >= 1 and f["grown_cpu"] > s3_tune.MIS_CPU, why
    assert f["executor_resources_ok"] >= 1 and f["executor_resources_failed"] == 0, why
    assert abs(f["cpu_quota_now"] - f["grown_cpu"]) <= 0.011, why
    assert f["gain"] >= s3_tune.GAIN_MIN and f["mis_sized_passed"], why
    # case 2: right-sized, the Planner looked and nothing changed
    assert f["right_looks"] >= s3_tune.MIN_LOOKS and f["right_moves"] == 0, why
    assert f["right_executor_changes"] == 0 and f["right_sized_passed"], why
    assert res.passed, why
    assert s3_tune.STRATEGY not in strategies  # turned off again
    assert [r["cpu_quota"] for r in restored] == [1.0]  # the declared CPU again
