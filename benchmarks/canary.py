"""Progressive delivery on the embedded default: a good and a planted-bad challenger, judged live by the agents.

    .venv/bin/python benchmarks/canary.py --quick [--check]

The digits workflow with `delivery: progressive` on its service (the default stages; with --quick shorter
ones: shadow 100 %, canary 20 %, each at least 10 s), clean traffic at `--rate` requests/s (150), the true
label of 20 % of the answers posted to the Tracker 2 s later. An operator delivers two versions one after
the other (the Executor's `start_delivery`):

- bad: the champion with its first layer reading each 8x8 image transposed (the planted defect: a
  preprocessing mismatch at serving time);
- good: the champion's recipe trained again with another seed (an equal model, not a copy).

Keys (the last line, JSON): `promoted` (1 when the good one reached full promotion), `rolled_back` (1 when
the bad one was rolled back), `bad_challenger_request_share` (the share of all client requests during the
bad delivery that the bad version answered; target at most the first canary share), `promotion_seconds`
(the good delivery's start to the champion alias on it), `rollback_seconds`, `paired_rows` of each
verdict, `failed_requests` over the whole run (target 0), and `target_met`. `--check` exits 1 when it is
not met.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from verdict import add_check, exit_code

QUICK_STAGES = [{"kind": "shadow", "share": 1.0, "min_labelled": 200, "min_seconds": 10, "timeout_s": 300},
                {"kind": "canary", "share": 0.2, "min_labelled": 50, "min_seconds": 10, "timeout_s": 300}]


def delivery_workflow(quick: bool) -> Any:
    from scanflow.examples.digits.workflow import workflow

    from scanflow.spec import Delivery

    delivery = Delivery.model_validate({"mode": "progressive", **({"stages": QUICK_STAGES} if quick else {})})
    services = [s.model_copy(update={"delivery": delivery}) if s.name == "digits" else s for s in workflow.services]
    agents = [a.model_copy(update={"strategies": [s for s in a.strategies if s.name != "autoscale"]})
              if a.role == "planner" else a for a in workflow.agents]
    return workflow.model_copy(update={"services": services, "agents": agents}), delivery


def register_good() -> str:
    """The champion's recipe with another seed: an equal model that answers some rows differently."""
    from scanflow.examples.digits.train import train

    return str(train(model_name="digits", seed=1, alias="candidate", experiment="digits-operator")["version"])


def deliver(stack: Any, version: str, timeout_s: float) -> dict[str, Any]:
    """Start the delivery of `version` and wait for the Planner's verdict (promote or rollback); returns
    the verdict's decision and when the delivery started and ended."""
    import httpx

    headers = {"Authorization": f"Bearer {stack.token}"}
    t0 = time.time()
    r = httpx.post(stack.agent_urls["executor"] + "/actuators/start_delivery", json={"args": {"version": version}},
                   headers=headers, timeout=300)
    if r.status_code != 200:
        raise SystemExit(f"start_delivery v{version}: {r.status_code} {r.text[:300]}")
    deadline = t0 + timeout_s
    while time.time() < deadline:
        plans = httpx.get(stack.agent_urls["planner"] + "/plans", headers=headers, timeout=30).json()
        done = [p for p in plans if p["policy"] == "delivery" and p["action"] in ("promote", "rollback")
                and float(p["at"]) >= t0]
        state = httpx.get(stack.service_url + "/admin/state", timeout=10).json()
        # ended in the Executor too (its record closed, the challenger's service gone): the next delivery may start
        services = httpx.get(stack.agent_urls["executor"] + "/services", headers=headers, timeout=30).json()
        if done and state.get("challenger") is None and not any(n.endswith("-challenger") for n in services):
            return {"decision": done[-1], "started": t0, "ended": time.time()}
        time.sleep(1.0)
    raise SystemExit(f"no verdict on v{version} within {timeout_s:.0f} s")


def run(home: Path, quick: bool, rate: float) -> dict[str, Any]:
    import mlflow

    from scanflow.stack import EmbeddedStack, Traffic
    from scanflow.tracking.registry import CHAMPION, get_alias_version

    wf, delivery = delivery_workflow(quick)
    pools = __import__("scanflow.examples.digits.s1", fromlist=["traffic_pools"]).traffic_pools()
    budget = sum(s.timeout_s for s in delivery.stages) + 120
    with EmbeddedStack(home, wf, quick=True) as stack:
        mlflow.set_tracking_uri(stack.tracking_uri)
        champion = str(get_alias_version("digits", CHAMPION))
        from scanflow.examples.digits.defects import register_transposed

        bad, good = register_transposed(champion), register_good()
        with Traffic(stack.service_url, pools["clean"], pools["drifted"], rate=rate, clients=3,
                     tracker_url=stack.agent_urls["tracker"], token=stack.token, feedback_fraction=0.2) as traffic:
            while traffic.count() < rate * 5:
                time.sleep(0.2)
            bad_run = deliver(stack, bad, budget)
            good_run = deliver(stack, good, budget)
            promoted_to = get_alias_version("digits", CHAMPION)
        answers = traffic.snapshot()
    during_bad = [a for a in answers if bad_run["started"] <= a.t <= bad_run["ended"]]
    bad_answers = [a for a in answers if a.version == bad]
    b, g = bad_run["decision"], good_run["decision"]
    return {
        "promoted": int(g["action"] == "promote" and str(promoted_to) == good),
        "rolled_back": int(b["action"] == "rollback"),
        "bad_challenger_request_share": round(len(bad_answers) / max(1, len(during_bad)), 4),
        "canary_share": next(s.share for s in delivery.stages if s.kind == "canary"),
        "promotion_seconds": round(good_run["ended"] - good_run["started"], 1),
        "rollback_seconds": round(bad_run["ended"] - bad_run["started"], 1),
        "rollback_reason": b["reason"], "paired_rows_bad": b["inputs"].get("paired_rows"),
        "paired_rows_good": g["inputs"].get("paired_rows"), "failed_requests": len(traffic.failed()),
        "requests": traffic.count(), "load_average_1m": round(os.getloadavg()[0], 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short stages (shadow, then a 20 %% canary, 10 s each)")
    ap.add_argument("--rate", type=float, default=150.0, help="client requests per second")
    add_check(ap)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="scanflow-canary-") as tmp:
        out = run(Path(tmp), a.quick, a.rate)
    out["target_met"] = bool(out["promoted"] == 1 and out["rolled_back"] == 1 and out["failed_requests"] == 0
                             and out["bad_challenger_request_share"] <= out["canary_share"])
    print(json.dumps(out))
    return exit_code(out, a.check)


if __name__ == "__main__":
    raise SystemExit(main())
