"""S2 end to end through the agents: on a quick EmbeddedStack, the demo's S2 scenario turns the Planner's
autoscale strategy on and steps the load 2 -> 24 -> 2 clients; the Checker's latency events reach the
Planner, whose policy scales up during the step, the Executor scales the LocalPlatform, and it scales
back down once after the step, with no failed request. Slow (a stack start, then ~1 minute)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(600)]


def test_s2_scales_up_on_the_step_and_back_down_through_the_agents(tmp_path: Path) -> None:
    import mlflow

    from scanflow.demo import s2_autoscale
    from scanflow.demo.common import DemoContext
    from scanflow.demo.runner import demo_workflow
    from scanflow.stack import EmbeddedStack

    with EmbeddedStack(tmp_path / "stack", demo_workflow(), quick=True) as stack:
        mlflow.set_tracking_uri(stack.tracking_uri)
        res = s2_autoscale.run(DemoContext(tmp_path, stack.tracking_uri, quick=True, stack=stack))
        strategies = [s["name"] for s in stack.get("planner", "/strategies")]
        plans = s2_autoscale.scale_moves(list(stack.get("planner", "/plans")), 0.0)
    f = res.figures
    assert res.error is None, res.error
    assert f["failed"] == 0 and f["requests"] > 500, f
    assert f["scale_up_after_s"] is not None and f["max_replicas"] > 1, (f, res.decisions)
    assert f["scale_down_after_s"] is not None and f["final_replicas"] == 1, (f, res.decisions)
    assert f["flaps"] == 0, res.decisions
    # the moves came from the Planner's policy and were executed by the Executor
    assert plans and plans[0]["action"] == "up" and f["executor_scale_actions"] >= 2, (plans, f)
    assert all(p["inputs"]["slo_latency_ms"] == f["slo_ms"] for p in plans)  # the SLO the Checker held
    assert "sim_hpa_slo_violation_s" in f  # the simulated comparison stays, labelled
    assert res.passed, (f, res.decisions)
    assert s2_autoscale.STRATEGY not in strategies  # turned off again after the scenario
