"""S1 end to end: corrupted traffic -> drift detected -> one retrain on critical points with TRUE labels ->
challenger evaluated -> promoted -> hot swap with 0 failed requests. Real MLflow, agents, replicas."""

from __future__ import annotations

import time

import pytest
from e2e_support import count_ok, digits_workflow
from scenario import run_s1

from scanflow.stack import EmbeddedStack, Traffic

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_s1_drift_retrain_promote_swap(tmp_path, pools) -> None:  # type: ignore[no-untyped-def]
    with EmbeddedStack(tmp_path / "stack", digits_workflow(), quick=True) as stack:
        with Traffic(stack.service_url, pools["clean"], pools["drifted"], rate=60, clients=3) as traffic:
            res = run_s1(stack, traffic)
            time.sleep(2.0)  # a few more answers from the new champion
        planner, executor = stack.decisions("planner"), stack.decisions("executor")
        plans = stack.get("planner", "/plans")

    assert res.new_version != res.old_version
    # the Planner's policy saw drift in k of m windows and asked for exactly one retrain
    retrain_decisions = [p for p in plans if p["policy"] == "retrain" and p["retrain"]]
    assert len(retrain_decisions) == 1, plans
    assert count_ok(planner, strategy="retrain-on-drift", result="fired") == 1
    # the Executor ran the plan once: retrain, evaluate_and_promote, swap_model
    fired = [d for d in executor if d["strategy"] == "execute-retrain" and d["result"] == "fired"]
    assert len(fired) == 1
    assert all(o["status"] == "ok" for o in fired[0]["outcomes"].values()), fired[0]["outcomes"]
    # the alias moved in MLflow, by the Executor, with the reason recorded
    moves = [p for p in res.promotions if p["actor"] == "executor"]
    assert len(moves) == 1 and moves[0]["version"] == res.new_version
    assert moves[0]["reason"].startswith("promote")
    assert moves[0]["metrics"]["challenger_accuracy_drifted"] > moves[0]["metrics"]["champion_accuracy_drifted"]
    # no failed request, and the last answers come from the new champion
    assert traffic.failed() == [], traffic.failed()[:3]
    last = [a for a in traffic.snapshot()[-20:] if a.status == 200]
    assert last and {a.version for a in last} == {res.new_version}
    print(f"S1: drift onset -> new champion serving in {res.served_at - res.onset:.1f}s; "
          f"{traffic.count()} requests, 0 failed")
