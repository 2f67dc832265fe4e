"""S1 end to end: corrupted traffic -> drift detected -> one retrain on critical points with TRUE labels from
feedback (20 % of requests, 2 s late, posted to the Tracker) -> challenger evaluated -> promoted -> hot swap
with 0 failed requests -> the world goes on drifted: fresh digits through the same drift, rows no
reference, retrain or calibration held, read as clean by the detector refitted for the new champion, and
five minutes of them with feedback flowing start no second retrain although the cooldown is 60 s.
Real MLflow, agents, replicas, all started by `scanflow up` and driven from outside.

The drift is S1's "new scanner" (workflows/digits/s1.py); the promotion gate evaluates on the champion's
clean reference holdout and on labelled drifted rows held out of the retrain."""

from __future__ import annotations

import time

import numpy as np
import pytest
from e2e_support import (
    MAX_FLAGGED,
    POST_SWAP_WINDOWS,
    RETRAIN_COOLDOWN_S,
    STABLE_S,
    count_ok,
    digits_workflow,
    fresh_checks,
    wait_for,
    with_retrain_cooldown,
)
from scenario import run_s1
from up_support import UpStack, detector_sources

from scanflow.stack import Traffic

Pool = tuple[np.ndarray, np.ndarray]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
RATE, WINDOW = 60, 200  # requests per second; rows per drift check (the quick window)


@pytest.fixture(scope="module")
def s1_pools() -> dict[str, Pool]:
    from scanflow.examples.digits.s1 import traffic_pools

    return traffic_pools()


def _unseen_drifted_accuracy(*versions: str) -> list[float]:
    """Each version's accuracy on drifted digits absent from training, traffic and the gate."""
    from scanflow.examples.digits.s1 import unseen_test

    from scanflow.tracking.registry import load_model

    _, x_d, y = unseen_test()
    return [float((load_model(f"models:/digits/{v}").predict(x_d) == y).mean()) for v in versions]


def _checks_by(stack: UpStack, version: str, at_least: int) -> list[dict] | None:  # type: ignore[type-arg]
    """The Checker's drift.checked events judged by `version`'s detector, once there are `at_least`."""
    got = [e for e in stack.events("checker") if e["name"] == "drift.checked"
           and str(e["payload"].get("detector_version")) == str(version)]
    return got if len(got) >= at_least else None


def _training_lineage(version: str) -> dict[str, str]:
    """What links `version` back to its plan (the Executor's monitoring.link_retrain): the version's
    tags and its training run's tags, by their short names; empty where a link is missing."""
    from mlflow import MlflowClient

    client = MlflowClient()
    tags = dict(client.get_model_version("digits", version).tags)
    run_id = tags.get("scanflow.training_run_id")
    run = client.get_run(run_id) if run_id else None
    run_tags = dict(run.data.tags) if run else {}
    return {"version_plan": tags.get("scanflow.plan_id", ""), "run_plan": run_tags.get("scanflow.plan_id", ""),
            "run_caused_by": run_tags.get("scanflow.caused_by", ""), "run_name": run.info.run_name if run else ""}


def test_s1_drift_retrain_promote_swap(tmp_path, s1_pools) -> None:  # type: ignore[no-untyped-def]
    pools = s1_pools
    from scanflow.examples.digits.s1 import post_drift_pool

    declared = tmp_path / "digits.yaml"  # the digits workflow without autoscaling, as a user's file
    declared.write_text(with_retrain_cooldown(digits_workflow(), RETRAIN_COOLDOWN_S).to_yaml())
    stack = UpStack(declared, tmp_path / "home", tmp_path / "up.out")
    try:
        with Traffic(stack.service_url, pools["clean"], pools["drifted"], rate=RATE, clients=3,
                     tracker_url=stack.agent_urls["tracker"], token=stack.token) as traffic:
            res = run_s1(stack, traffic)
            # the world S1 left: fresh digits through the same drift, judged by the new champion's detector
            traffic.drift_pool = post_drift_pool()
            switched = time.time()
            post = wait_for(lambda: (got := fresh_checks(_checks_by(stack, res.new_version, 1) or [], switched,
                                                         WINDOW / RATE)) and len(got) >= POST_SWAP_WINDOWS and got,
                            150, what=f"{POST_SWAP_WINDOWS} drift checks of fresh rows by the new champion's detector")
            # five minutes of it, labels flowing, cooldown 60 s: only the drift rule can hold a second retrain back
            wait_for(lambda: time.time() > switched + STABLE_S, STABLE_S + 30, interval_s=5.0,
                     what="five minutes of stable post-drift traffic")
            stable = fresh_checks(_checks_by(stack, res.new_version, 1) or [], switched, WINDOW / RATE)
        planner, executor = stack.decisions("planner"), stack.decisions("executor")
        plans = stack.get("planner", "/plans")
        unseen = _unseen_drifted_accuracy(res.old_version, res.new_version)
        lineage = _training_lineage(res.new_version)
        detectors = detector_sources(stack)
    finally:
        stack.down()

    assert res.new_version != res.old_version
    # the Planner's policy (the drift CUSUM) alarmed and asked for exactly one retrain
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
    # the new version and its training run name the plan that caused them (the Executor's link_retrain)
    assert lineage["version_plan"] and lineage["run_plan"] == lineage["version_plan"], lineage
    assert lineage["run_caused_by"].startswith("seq ") and "-plan-" in lineage["run_name"], lineage
    # the new champion learned the drift: better on drifted digits it never saw (not only on pool rows)
    assert unseen[1] > unseen[0], unseen
    # no failed request, and the last answers come from the new champion
    assert traffic.failed() == [], traffic.failed()[:3]
    last = [a for a in traffic.snapshot()[-20:] if a.status == 200]
    assert last and {a.version for a in last} == {res.new_version}
    assert traffic.feedback_counts().acknowledged > 0
    # the loop converged: the detector was refitted for the new champion, from its serving reference
    # (the drifted traffic), and reads fresh rows of the drifted world as clean at its false-positive rate
    assert detectors.get(res.new_version, "").endswith("scanflow/serving_reference"), detectors
    first = sorted(post, key=lambda e: e["received_at"])[:POST_SWAP_WINDOWS]
    flagged = sum(bool(e["payload"]["drift"]) for e in first)
    assert flagged <= MAX_FLAGGED, [e["payload"]["p_value"] for e in first]
    # five minutes of fresh post-drift traffic with feedback and a 60 s cooldown: no second retrain
    assert len(retrain_decisions) == 1, plans
    assert len(stable) >= 3 * POST_SWAP_WINDOWS, len(stable)
    flagged_stable = sum(bool(e["payload"]["drift"]) for e in stable)
    print(f"S1: drift onset -> new champion serving in {res.served_at - res.onset:.1f}s; "
          f"{traffic.count()} requests, 0 failed; unseen drifted digits v{res.old_version} {unseen[0]:.3f} -> "
          f"v{res.new_version} {unseen[1]:.3f}; fresh post-drift windows flagged {flagged} of {len(first)}, "
          f"{flagged_stable} of {len(stable)} in {STABLE_S:.0f} s")
