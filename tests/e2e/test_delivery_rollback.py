"""A bad challenger is rolled back by the agents (digits, `delivery: progressive`); the champion never stops
serving, no client is answered by the bad version, 0 failed requests.

- An operator delivers a version that reads its inputs in the wrong layout (the planted defect: its first layer
  sees each 8x8 image transposed, as a preprocessing mismatch at serving time would): the shadow stage's paired
  labelled rows show it worse than the champion, the Planner rolls it back, the Executor removes its replicas.
- S1's own retrain makes a challenger that is as accurate as it should be and waits 100 ms on every call (the
  training job's `serving_delay_ms`): it passes the offline gate, which times nothing, and its live p99 in shadow
  breaks the service's SLO, so the Planner rolls it back at once."""

from __future__ import annotations

import httpx
import pytest
from delivery_support import delivery_workflow
from e2e_support import count_ok, wait_for
from scenario import champion
from up_support import UpStack

from scanflow.stack import Traffic

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
RATE = 60


def test_a_worse_challenger_is_rolled_back_in_shadow_and_never_answers_a_client(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from scanflow.examples.digits.s1 import traffic_pools

    pools = traffic_pools()
    declared = tmp_path / "digits.yaml"
    declared.write_text(delivery_workflow().to_yaml())
    stack = UpStack(declared, tmp_path / "home", tmp_path / "up.out")
    try:
        with Traffic(stack.service_url, pools["clean"], pools["drifted"], rate=RATE, clients=3,
                     tracker_url=stack.agent_urls["tracker"], token=stack.token) as traffic:
            old = wait_for(lambda: champion(stack), 60, what="the bootstrap champion")
            wait_for(lambda: traffic.count() > 50, 60, what="clean traffic answered")
            import mlflow
            from scanflow.examples.digits.defects import register_transposed

            mlflow.set_tracking_uri(stack.tracking_uri)
            bad = register_transposed(old)
            started = httpx.post(stack.agent_urls["executor"] + "/actuators/start_delivery", timeout=120,
                                 json={"args": {"version": bad}}, headers={"Authorization": f"Bearer {stack.token}"})
            assert started.status_code == 200 and started.json()["status"] == "succeeded", started.text
            other = httpx.post(stack.agent_urls["executor"] + "/actuators/start_delivery", timeout=60,
                               json={"args": {"version": "999"}}, headers={"Authorization": f"Bearer {stack.token}"})
            assert other.status_code == 422 and "is running" in other.json()["detail"]  # one delivery at a time
            plans = wait_for(lambda: [p for p in stack.get("planner", "/plans") if p["policy"] == "delivery"],
                             300, what="the Planner's delivery decision")
            gone = wait_for(lambda: httpx.get(stack.service_url + "/admin/state", timeout=10).json()["challenger"] is None,
                            60, what="the challenger off the gateway")
            services = wait_for(lambda: (s := stack.get("executor", "/services")) and "digits-challenger" not in s and s,
                                60, what="the challenger's service removed")
            still = champion(stack)
        executor = stack.decisions("executor")
        from mlflow import MlflowClient

        tags = wait_for(lambda: (t := MlflowClient().get_model_version("digits", bad).tags).get("scanflow.rolled_back")
                        and t, 60, what="the rolled-back version's tag")  # tagged once its replicas are gone
    finally:
        stack.down()

    assert [p["action"] for p in plans] == ["rollback"], plans
    rollback = plans[0]
    assert "worse than the champion" in rollback["reason"] and rollback["inputs"]["stage_kind"] == "shadow"
    assert rollback["inputs"]["paired_high"] < -rollback["inputs"]["margin"]
    assert count_ok(executor, strategy="execute-delivery", result="fired") == 1
    assert gone and "digits-challenger" not in services
    assert still == old and "worse than the champion" in tags.get("scanflow.rolled_back", "")
    answers = traffic.snapshot()
    assert traffic.failed() == [], traffic.failed()[:3]
    assert not [a for a in answers if a.version == bad]  # shadow only: no client got the bad version's answer
    print(f"bad challenger v{bad} rolled back after {rollback['inputs']['paired_rows']} paired labelled rows "
          f"(gap {rollback['inputs']['paired_gap']}); it answered 0 of {traffic.count()} client requests "
          f"and {rollback['inputs']['requests']} mirrored ones")


SLOW_MS = 100.0  # twice the digits service's p99 SLO (50 ms)


def test_a_retrained_challenger_that_passes_the_gate_but_answers_late_is_rolled_back(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from scanflow.examples.digits.s1 import traffic_pools

    pools = traffic_pools()
    wf = delivery_workflow()
    jobs = [j.model_copy(update={"params": {**j.params, "serving_delay_ms": SLOW_MS}}) if j.name == "train" else j
            for j in wf.jobs]
    declared = tmp_path / "digits.yaml"
    declared.write_text(wf.model_copy(update={"jobs": jobs}).to_yaml())
    stack = UpStack(declared, tmp_path / "home", tmp_path / "up.out")
    try:
        with Traffic(stack.service_url, pools["clean"], pools["drifted"], rate=RATE, clients=3,
                     tracker_url=stack.agent_urls["tracker"], token=stack.token) as traffic:
            old = wait_for(lambda: champion(stack), 60, what="the bootstrap champion")
            wait_for(lambda: traffic.count() > 50, 60, what="clean traffic answered")
            traffic.drifted = True
            plans = wait_for(lambda: [p for p in stack.get("planner", "/plans") if p["policy"] == "delivery"],
                             480, what="the Planner's delivery decision after S1's retrain")
            gone = wait_for(lambda: httpx.get(stack.service_url + "/admin/state", timeout=10).json()["challenger"] is None,
                            60, what="the challenger off the gateway")
            still = champion(stack)
        executor = stack.decisions("executor")
        from mlflow import MlflowClient

        # the retrain's challenger passed the offline gate and went to a delivery instead of the alias
        gates = [o["result"] for d in executor if d["strategy"] == "execute-retrain" and d["result"] == "fired"
                 for o in d["outcomes"].values() if (o.get("result") or {}).get("delivery")]
        assert gates and gates[-1]["delivery"] == "digits-challenger", executor
        bad = str(gates[-1]["version"])  # the first retrain's (the decisions are newest first)
        # the Executor tags the version once its replicas are gone
        tags = wait_for(lambda: (t := MlflowClient().get_model_version("digits", bad).tags).get("scanflow.rolled_back")
                        and t, 60, what="the rolled-back version's tag")
    finally:
        stack.down()

    assert [p["action"] for p in plans] == ["rollback"], plans
    rollback = plans[0]
    assert rollback["inputs"]["stage_kind"] == "shadow" and "p99" in rollback["reason"], rollback
    # judged against the champion timed on the same gateway, which meets the SLO (only the challenger is slowed)
    inputs = rollback["inputs"]
    assert inputs["p99_ms"] > inputs["slo_p99_ms"] and inputs["champion_timed"] >= 200, inputs
    assert inputs["p99_ms"] > 2 * inputs["champion_p99_ms"] and "over the champion's" in rollback["reason"], inputs
    assert gone and still == old
    assert int(bad) > int(old) and "p99" in tags.get("scanflow.rolled_back", ""), tags
    assert traffic.failed() == [], traffic.failed()[:3]
    assert not [a for a in traffic.snapshot() if a.version == bad]  # shadow only: no client got its answer
    print(f"slow challenger v{bad} (passed the offline gate) rolled back in shadow: p99 {inputs['p99_ms']:.0f} ms "
          f"(champion {inputs['champion_p99_ms']:.0f} ms, SLO {inputs['slo_p99_ms']:.0f} ms) after "
          f"{inputs['requests']} mirrored requests; it answered 0 of {traffic.count()} client requests")
