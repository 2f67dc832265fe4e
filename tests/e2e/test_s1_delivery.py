"""Progressive delivery end to end (both shipped workflows, `delivery: progressive`): after S1's retrain passes
the offline gate, the challenger gets its own replicas, is mirrored in shadow, answers a canary share, and is promoted by
the Planner on live labelled rows; 0 failed requests, each stage a decision with its figures. Real MLflow,
agents, gateways and replicas, started by `scanflow up` and driven from outside."""

from __future__ import annotations

import httpx
import pytest
from delivery_support import CANARY_SHARE, DELIVERY, delivery_workflow
from e2e_support import count_ok, wait_for
from scenario import run_s1
from up_support import UpStack

from scanflow.stack import Traffic

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
RATE = 60


@pytest.mark.parametrize("example", ["digits", "sensors"])
def test_s1_challenger_goes_through_shadow_and_canary_to_promotion(tmp_path, example: str) -> None:  # type: ignore[no-untyped-def]
    import importlib

    pools = importlib.import_module(f"scanflow.examples.{example}.s1").traffic_pools()
    challenger = f"{example}-challenger"
    declared = tmp_path / f"{example}.yaml"
    declared.write_text(delivery_workflow(example).to_yaml())
    stack = UpStack(declared, tmp_path / "home", tmp_path / "up.out")
    try:
        with Traffic(stack.service_url, pools["clean"], pools["drifted"], rate=RATE, clients=3,
                     tracker_url=stack.agent_urls["tracker"], token=stack.token) as traffic:
            res = run_s1(stack, traffic, timeout_s=480.0, model=example)
            gone = wait_for(lambda: httpx.get(stack.service_url + "/admin/state", timeout=10).json()["challenger"] is None,
                            60, what="the challenger off the gateway")
            services = wait_for(lambda: (s := stack.get("executor", "/services")) and challenger not in s and s,
                                60, what="the challenger's service removed")
        plans = stack.get("planner", "/plans")
        executor = stack.decisions("executor")
    finally:
        stack.down()

    assert gone and challenger not in services, sorted(services)
    stages = [p for p in plans if p["policy"] == "delivery"]
    assert [p["action"] for p in stages] == ["advance", "promote"], stages
    shadow, canary = stages
    # the shadow passed on paired rows (both models answered them), the canary on the challenger's own
    assert shadow["inputs"]["stage_kind"] == "shadow" and shadow["inputs"]["paired_rows"] >= 100
    assert shadow["inputs"]["not_worse"] and shadow["inputs"]["paired_low"] > -DELIVERY.margin
    assert (shadow["kind"], shadow["share"]) == ("canary", CANARY_SHARE)
    assert canary["inputs"]["stage_kind"] == "canary" and canary["inputs"]["labelled"] >= 20
    assert canary["inputs"]["errors"] == 0
    assert count_ok(executor, strategy="execute-delivery", result="fired") == 2
    # the alias moved once, by the Executor, at the end of the delivery, with the live figures
    moves = [p for p in res.promotions if p["actor"] == "executor"]
    assert len(moves) == 1 and moves[0]["version"] == res.new_version
    assert moves[0]["reason"].startswith("progressive delivery"), moves[0]
    # the canary answered some clients before the promotion; nobody saw a failure
    promoted_at = float(moves[0]["ts"])
    answers = traffic.snapshot()
    early = [a for a in answers if a.status == 200 and a.version == res.new_version and a.t < promoted_at]
    assert early, "no client was answered by the challenger during the canary"
    assert traffic.failed() == [], traffic.failed()[:3]
    first_challenger = min(a.t for a in early)
    old_answers = [a.t for a in answers if a.status == 200 and a.version != res.new_version]
    all_new = min(a.t for a in answers if a.status == 200 and a.t > max(old_answers))
    print(f"S1 ({example}) with progressive delivery: onset -> first answer by the challenger {first_challenger - res.onset:.1f}s, "
          f"-> promoted {promoted_at - res.onset:.1f}s, -> every answer by it {all_new - res.onset:.1f}s; "
          f"{traffic.count()} requests, 0 failed; shadow: {shadow['inputs']['paired_rows']} paired rows, "
          f"gap {shadow['inputs']['paired_gap']}; canary: {canary['inputs']['labelled']} labelled rows")
