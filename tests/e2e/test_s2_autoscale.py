"""S2 end to end through the agents: on a quick EmbeddedStack, the demo's S2 scenario gives the service's
replicas a small CPU limit through the Executor, calibrates one replica's capacity, turns the Planner's
autoscale strategy (vertical-first) on and steps an open-loop load low -> high -> low; the Checker's
observations reach the Planner, whose policy adds capacity during the step (cores in place where the
node has idle ones, replicas past that), the Executor applies every plan (resources read back), and the
capacity comes back down once after the step, with no failed request. Asserted from the agents' audit logs (/plans,
/decisions). Slow (a stack start, then ~1 minute). Where cgroup CPU limits cannot be applied the scenario
runs in-process instead, and this test is skipped (as with SCANFLOW_DEMO_S2=inprocess).

The test keeps one core busy with a spin loop of its own for the whole run (SCANFLOW_E2E_BUSY_CORE=0
turns that off): the bar is 5 passes in 5 runs on a busy machine. Measured: 5 of 5 with the core burned
while other work kept the load average at 10-14 (3.8-5.0 minutes each; fitted limits 0.05-0.08 core, up 0.8-1.9 s after the step, down 4.6-12.7 s after the fall, all in place);
and 5 of 5 again on the gateway's fast front, now the default (2.5-2.9 minutes each, load 1.1-3.8 at the
starts; up 1.0-1.8 s after the step, down 12.2-13.4 s after the fall, 0 failed of 8,659-13,389). It failed 5 of 6 before the
scenario fitted the replica's limit to what the generator can send (`s2_capacity.fitted_cpu`): with
micro-batching, 400 rps used 0.13 of a quarter core, so the step was no overload and the Planner
rightly did not move."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
from e2e_support import busy_core

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(600),
              pytest.mark.skipif(os.environ.get("SCANFLOW_DEMO_S2") == "inprocess",
                                 reason="SCANFLOW_DEMO_S2=inprocess: S2 runs in-process")]


def test_s2_scales_up_on_the_step_and_back_down_through_the_agents(tmp_path: Path) -> None:
    import mlflow

    from scanflow.demo import s2_autoscale, s2_stack
    from scanflow.demo.common import DemoContext
    from scanflow.demo.runner import demo_workflow
    from scanflow.platform.cgroups import detect
    from scanflow.stack import EmbeddedStack

    if not detect().usable:
        pytest.skip(f"no cgroup CPU limits here ({detect().reason}): S2 runs in-process")
    burn = busy_core() if os.environ.get("SCANFLOW_E2E_BUSY_CORE", "1") != "0" else contextlib.nullcontext()
    with burn, EmbeddedStack(tmp_path / "stack", demo_workflow(), quick=True) as stack:
        mlflow.set_tracking_uri(stack.tracking_uri)
        res = s2_autoscale.run(DemoContext(tmp_path, stack.tracking_uri, quick=True, stack=stack))
        strategies = [s["name"] for s in stack.get("planner", "/strategies")]
        plans = s2_autoscale.scale_moves(list(stack.get("planner", "/plans")), 0.0)
        applied, exec_failed = s2_autoscale.executions(stack.decisions("executor", limit=1000), 0.0)
        restored = stack.get("executor", "/services")["digits"]["replicas"]
    f = res.figures
    assert res.error is None, res.error
    assert f["mode"] == "agents", (f, res.decisions)
    assert f["failed"] == 0 and f["unsent"] == 0 and f["requests"] > 500, f
    assert f["high_rps"] > f["capacity_rps"] > f["low_rps"] > 0, f  # the step exceeds one replica's capacity
    # the moves came from the Planner's policy on the Checker's observations, applied by the Executor
    why = (f, res.decisions)
    print(f"S2: {f}\n{res.decisions}")
    assert plans and s2_autoscale.direction(plans[0]["action"]) == "up", why
    assert plans[0]["inputs"].get("arrival_rate") is not None, why  # observed, not an oracle
    assert s2_autoscale.direction(plans[-1]["action"]) == "down" and s2_autoscale.flaps(
        [p["action"] for p in plans]) == 0, why
    # S2 restores the declared resources through the Executor too (executions after the scenario's own)
    assert applied >= s2_autoscale.plans_expected(plans) and exec_failed == 0, (applied, exec_failed, why)
    assert all(p["inputs"]["slo_latency_ms"] == f["slo_ms"] for p in plans)  # the SLO the Checker held
    assert f["scale_up_after_s"] is not None and (f["max_replicas"] > 1 or f["grow_moves"] > 0), why
    assert f["scale_down_after_s"] is not None and f["final_replicas"] == 1, why
    assert res.passed, (f, res.decisions)
    assert s2_stack.STRATEGY not in strategies  # turned off again after the scenario
    assert [r["cpu_quota"] for r in restored] == [1.0]  # the declared CPU again
