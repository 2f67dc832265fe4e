"""S1 on workflows the framework never saw, through `scanflow up`, with labels only as feedback.

- The tabular example (workflows/sensors: 13 columns, one categorical, a scikit-learn model served
  through its MLflow flavour, a sensor-recalibration drift): drift detected -> one retrain on critical
  points labelled by feedback (20 % of requests, 2 s late) -> promoted -> swapped with 0 failed
  requests -> fresh readings of the recalibrated world (no reference, retrain or calibration held them)
  read as clean by the detector refitted for the new champion, and five minutes of them with feedback
  and a 60 s cooldown start no second retrain.
- A regression fixture (tests/fixtures/reg5: 5 features, a pyfunc model): `scanflow up` runs it and
  its drift checks do not fail.
- A skeleton from `scanflow init`, outside the repository: every process imports the team's package.
Both drive the stack from outside, as a user does: stack.json for the addresses, the token file, HTTP.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from e2e_support import (
    MAX_FLAGGED,
    POST_SWAP_WINDOWS,
    RETRAIN_COOLDOWN_S,
    STABLE_S,
    fresh_checks,
    wait_for,
    with_retrain_cooldown,
    without_planner_strategies,
)
from up_support import REPO, UpStack, detector_sources

from scanflow.private_files import open_to_others
from scanflow.stack import Traffic

RATE, WINDOW = 60, 200  # requests per second; rows per drift check (the quick window)
pytestmark = [pytest.mark.slow]


@pytest.fixture
def up_stack(tmp_path: Path) -> Iterator[Any]:
    started: list[UpStack] = []

    def start(workflow: Path) -> UpStack:
        s = UpStack(workflow, tmp_path / f"home{len(started)}", tmp_path / f"up{len(started)}.out")
        started.append(s)
        return s

    yield start
    for s in started:
        s.down()


def _champion(stack: UpStack, model: str) -> str | None:
    import mlflow

    from scanflow.tracking.registry import CHAMPION, get_alias_version

    mlflow.set_tracking_uri(stack.tracking_uri)
    return get_alias_version(model, CHAMPION)


def _drift_checks(stack: UpStack, version: str | None = None) -> list[dict[str, Any]]:
    return [e for e in stack.get("checker", "/events", limit=1000) if e["name"] == "drift.checked"
            and (version is None or str(e["payload"].get("detector_version")) == str(version))]


@pytest.mark.timeout(1200)
def test_s1_on_the_tabular_workflow_through_scanflow_up(up_stack: Any, tmp_path: Path) -> None:
    from scanflow.examples.sensors.s1 import post_drift_pool, traffic_pools
    from scanflow.examples.sensors.workflow import workflow

    declared = tmp_path / "sensors.yaml"  # without autoscaling, as S1 runs (e2e_support); cooldown 60 s
    declared.write_text(with_retrain_cooldown(without_planner_strategies(workflow), RETRAIN_COOLDOWN_S).to_yaml())
    stack = up_stack(declared)
    model = "sensors"
    pools = traffic_pools()
    old = wait_for(lambda: _champion(stack, model), 30, what="the bootstrap champion")
    with Traffic(stack.service_url, pools["clean"], pools["drifted"], rate=RATE, clients=3,
                 tracker_url=stack.agent_urls["tracker"], token=stack.token) as traffic:
        wait_for(lambda: traffic.count() > 100, 60, what="clean traffic answered")
        onset = time.time()
        traffic.drifted = True

        def new_serves() -> str | None:
            cur = _champion(stack, model)
            recent = [a for a in traffic.snapshot()[-20:] if a.status == 200]
            return cur if cur not in (None, old) and recent and all(a.version == cur for a in recent) else None

        new = wait_for(new_serves, 300, what="a new champion serving after the drift onset")
        served = min(a.t for a in traffic.snapshot() if a.version == new)
        accuracy_before = traffic.accuracy(since=onset, drifted=True, version=old)
        # the world S1 left: fresh recalibrated readings, judged by the new champion's detector
        traffic.drift_pool = post_drift_pool()
        switched = time.time()
        post = wait_for(lambda: (got := fresh_checks(_drift_checks(stack, new), switched, WINDOW / RATE))
                        and len(got) >= POST_SWAP_WINDOWS and got,
                        150, what=f"{POST_SWAP_WINDOWS} drift checks of fresh rows by the new champion's detector")
        accuracy_after = traffic.accuracy(since=switched, drifted=True, version=new)  # rows it never trained on
        # five minutes of them, labels flowing, cooldown 60 s: only the drift rule can hold a second retrain back
        wait_for(lambda: time.time() > switched + STABLE_S, STABLE_S + 30, interval_s=5.0,
                 what="five minutes of stable post-drift traffic")
        stable = fresh_checks(_drift_checks(stack, new), switched, WINDOW / RATE)
        detectors = detector_sources(stack)
    plans = stack.get("planner", "/plans")
    executor = stack.get("executor", "/decisions", limit=1000)

    assert traffic.failed() == [], traffic.failed()[:3]
    assert traffic.feedback_counts().acknowledged > 0
    assert len([p for p in plans if p["policy"] == "retrain" and p["retrain"]]) == 1, plans
    fired = [d for d in executor if d["strategy"] == "execute-retrain" and d["result"] == "fired"]
    assert len(fired) == 1 and all(o["status"] == "ok" for o in fired[0]["outcomes"].values()), fired
    assert accuracy_after > accuracy_before + 0.2, (accuracy_before, accuracy_after)
    # refitted for the new champion from its serving reference, which reads fresh rows of the new world as clean
    assert detectors.get(str(new), "").endswith("scanflow/serving_reference"), detectors
    first = sorted(post, key=lambda e: e["received_at"])[:POST_SWAP_WINDOWS]
    flagged = sum(bool(e["payload"]["drift"]) for e in first)
    assert flagged <= MAX_FLAGGED, [e["payload"]["p_value"] for e in first]
    assert len(stable) >= 3 * POST_SWAP_WINDOWS, len(stable)
    flagged_stable = sum(bool(e["payload"]["drift"]) for e in stable)
    print(f"S1 sensors through scanflow up: onset -> v{new} serving {served - onset:.1f}s, drifted accuracy "
          f"{accuracy_before:.3f} -> {accuracy_after:.3f} (fresh rows), {flagged} of {len(first)} fresh post-drift "
          f"windows flagged, {flagged_stable} of {len(stable)} in {STABLE_S:.0f} s, one retrain")


@pytest.mark.timeout(600)
def test_a_regression_workflow_of_another_width_runs_with_drift_checks(up_stack: Any) -> None:
    stack = up_stack(REPO / "tests" / "fixtures" / "reg5" / "workflow.py")
    service = stack.service_url
    rng = np.random.default_rng(0)
    with httpx.Client(timeout=30.0) as http:
        for i in range(450):  # past two quick windows of the Tracker (it counts requests)
            rows = rng.normal(size=(2, 5)).tolist()
            r = http.post(f"{service}/predict", json={"inputs": rows, "request_id": f"reg-{i}"})
            assert r.status_code == 200, r.text
            assert all(isinstance(v, float) for v in r.json()["outputs"])
    checks = wait_for(lambda: _drift_checks(stack), 120, what="a drift check of the regression workflow")
    assert checks[0]["payload"]["n"] > 0
    failed = [d for d in stack.get("checker", "/decisions", limit=1000) if d["result"] == "error"
              or any(o.get("status") not in ("ok", None) for o in (d.get("outcomes") or {}).values())]
    assert not failed, failed
    # the stack's files are its own: the home 0700, everything under it 0600 / 0700 (labels, models,
    # databases, spools, the token), whichever process wrote it
    home = stack.home
    assert (home / "token").exists() and any(home.rglob("*.db")) and any(home.rglob("MLmodel"))
    assert open_to_others(home) == []


@pytest.mark.timeout(600)
def test_a_scaffolded_workflow_outside_the_repository_runs(up_stack: Any, tmp_path: Path) -> None:
    """`scanflow init` writes a team's package somewhere else; `scanflow up` imports it in every process."""
    from scanflow.scaffold import write

    pkg = write("teamskel", tmp_path / "team")
    stack = up_stack(pkg / "workflow.py")
    rng = np.random.default_rng(1)
    with httpx.Client(timeout=30.0) as http:
        for i in range(220):
            r = http.post(f"{stack.service_url}/predict", json={"inputs": rng.normal(size=(1, 8)).tolist()})
            assert r.status_code == 200, r.text
    checks = wait_for(lambda: _drift_checks(stack), 120, what="a drift check of the scaffolded workflow")
    assert checks[0]["payload"]["n"] > 0
