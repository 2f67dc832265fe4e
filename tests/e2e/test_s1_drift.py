"""S1 end to end: corrupted traffic -> drift detected -> one retrain on critical points with TRUE labels ->
challenger evaluated -> promoted -> hot swap with 0 failed requests. Real MLflow, agents, replicas.

The drift is S1's "new scanner" (workflows/digits/s1.py); the promotion gate evaluates on feedback digits
the traffic never carried."""

from __future__ import annotations

import time

import numpy as np
import pytest
from e2e_support import count_ok, digits_workflow
from scenario import run_s1

from scanflow.stack import EmbeddedStack, Traffic

Pool = tuple[np.ndarray, np.ndarray]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def s1_pools() -> dict[str, Pool]:
    from workflows.digits.s1 import traffic_pools

    return traffic_pools()


def _unseen_drifted_accuracy(*versions: str) -> list[float]:
    """Each version's accuracy on drifted digits absent from training, traffic and the gate."""
    from scanflow.tracking.registry import load_model
    from workflows.digits.s1 import unseen_test

    _, x_d, y = unseen_test()
    return [float((load_model(f"models:/digits/{v}").predict(x_d) == y).mean()) for v in versions]


def test_s1_drift_retrain_promote_swap(tmp_path, s1_pools) -> None:  # type: ignore[no-untyped-def]
    pools = s1_pools
    with EmbeddedStack(tmp_path / "stack", digits_workflow(), quick=True) as stack:
        with Traffic(stack.service_url, pools["clean"], pools["drifted"], rate=60, clients=3,
                     tracker_url=stack.agent_urls["tracker"], token=stack.token, feedback_fraction=1.0) as traffic:
            res = run_s1(stack, traffic)
            time.sleep(2.0)  # a few more answers from the new champion
        planner, executor = stack.decisions("planner"), stack.decisions("executor")
        plans = stack.get("planner", "/plans")
        unseen = _unseen_drifted_accuracy(res.old_version, res.new_version)

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
    # the new champion learned the drift: better on drifted digits it never saw (not only on pool rows)
    assert unseen[1] > unseen[0], unseen
    # no failed request, and the last answers come from the new champion
    assert traffic.failed() == [], traffic.failed()[:3]
    last = [a for a in traffic.snapshot()[-20:] if a.status == 200]
    assert last and {a.version for a in last} == {res.new_version}
    print(f"S1: drift onset -> new champion serving in {res.served_at - res.onset:.1f}s; "
          f"{traffic.count()} requests, 0 failed; unseen drifted digits v{res.old_version} {unseen[0]:.3f} -> "
          f"v{res.new_version} {unseen[1]:.3f}")
