"""S1 drift: corrupted inputs -> Checker detects drift -> Planner plans a retrain on critical points with
true labels -> Executor trains, evaluates, promotes the challenger and hot-swaps the service.

Drives the EmbeddedStack's real agents with labelled traffic (scanflow.stack.Traffic): clean rows
first, then the same images from a "new scanner" (washed-out contrast plus mild read noise,
workflows/digits/s1.py); it only watches (MLflow aliases, the answers' model
versions, the agents' decisions and events) and never steers. Mirrors tests/e2e/scenario.py.
Who calls: scanflow.demo.runner.
"""

from __future__ import annotations

import math
import textwrap
import time
from typing import Any

import numpy as np

from scanflow.demo.common import DemoContext, wait_for
from scanflow.demo.report import ScenarioResult

BAR = ("a new champion serves after the drift onset (deadline), 0 failed requests, accuracy on drifted rows rises, "
       "and at most 2 of 5 windows of fresh drifted rows flagged by its detector afterwards")
POST_WINDOWS, MAX_POST_FLAGGED = 5, 2  # fresh post-drift windows judged after the swap; 3+ flagged: < 1 % at 5 %
MODEL = "digits"
RATE = 60  # requests per second of S1's traffic


def pools() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """S1's traffic digits with true labels, clean and drifted (8 corrupted copies of each); the
    feedback digits held out for the promotion gate are never sent."""
    from scanflow.examples.digits.s1 import traffic_pools

    return traffic_pools()


def champion() -> str | None:
    from scanflow.tracking.registry import CHAMPION, get_alias_version

    return get_alias_version(MODEL, CHAMPION)


def drift_series(events: list[dict[str, Any]], t0: float) -> dict[str, list[Any]]:
    """Pure: (t since t0, score, drift flag, p-value or None) of the Checker's `drift.checked` events,
    oldest first."""
    rows = sorted((e.get("received_at", 0.0), e["payload"]) for e in events
                  if e.get("name") == "drift.checked" and isinstance(e.get("payload"), dict))
    out: dict[str, list[Any]] = {"t": [], "score": [], "drift": [], "p_value": []}
    for at, p in rows:
        score = p.get("score")
        if isinstance(score, (int, float)) and math.isfinite(score):
            out["t"].append(round(at - t0, 2))
            out["score"].append(float(score))
            out["drift"].append(bool(p.get("drift")))
            pv = p.get("p_value")
            out["p_value"].append(float(pv) if isinstance(pv, (int, float)) and math.isfinite(pv) else None)
    return out


def post_swap_checks(events: list[dict[str, Any]], version: str, after: float) -> list[dict[str, Any]]:
    """Pure: the `drift.checked` events judged by `version`'s detector and received after `after`, oldest
    first (the windows made of rows sent after the traffic switched to fresh rows)."""
    got = [e for e in events if e.get("name") == "drift.checked" and isinstance(e.get("payload"), dict)
           and str(e["payload"].get("detector_version")) == version and float(e.get("received_at") or 0) > after]
    return sorted(got, key=lambda e: float(e.get("received_at") or 0))


def decision_line(label: str, reason: str, width: int = 100) -> str:
    """Pure: 'label: reason' for the summary, without repeating a verdict the reason already starts with
    ("retrain: drift in 3 of ..." stays as it is) and shortened at a word, not mid-parenthesis."""
    text = reason if reason.startswith(f"{label}:") else f"{label}: {reason}"
    return textwrap.shorten(text, width=width, placeholder=" ...")


def run(ctx: DemoContext) -> ScenarioResult:
    from scanflow.agentkit.detectors import detector_options
    from scanflow.stack import Traffic

    res = ScenarioResult("s1", "drift -> retrain -> promote -> swap", BAR)
    stack = ctx.stack
    if stack is None:
        res.error = "the embedded stack (agents) is not running"
        return res
    deadline = 200.0 if ctx.quick else 300.0
    p = pools()
    t0 = time.time()
    with Traffic(stack.service_url, p["clean"], p["drifted"], rate=RATE, clients=3,
                     tracker_url=stack.agent_urls["tracker"], token=stack.token) as traffic:
        old = champion()
        ctx.say(f"S1: clean traffic to champion v{old}")
        # one clean window checked first (the Tracker asks for a check every 500 predictions): the
        # drift plot then shows the score before and after the onset
        wait_for(lambda: any(e.get("name") == "drift.checked" for e in stack.events("checker")), 60, 1.0)
        onset = time.time()
        traffic.drifted = True
        ctx.world_drifted = True  # the scenarios after this one send the world S1 leaves (`traffic_rows`)
        ctx.say("S1: drift onset (new scanner: washed-out contrast); waiting for detection, retrain, promotion, swap")
        new: str | None = None

        def new_version_serves() -> bool:
            nonlocal new
            cur = champion()
            if cur is None or cur == old:
                return False
            recent = [a for a in traffic.snapshot()[-20:] if a.status == 200]
            if recent and all(a.version == cur for a in recent):
                new = cur
                return True
            n = len(stack.events("checker", limit=1000))
            ctx.say(f"S1: champion v{cur} promoted, swapping ({n} checker events)")
            return False

        wait_for(new_version_serves, deadline, interval_s=1.0)
        post: list[dict[str, Any]] = []
        if new is not None:
            ctx.say(f"S1: v{new} serves; measuring its accuracy on drifted rows")
            wait_for(lambda: sum(1 for a in traffic.snapshot() if a.version == new and a.drifted) >= 150, 30)
            # the world S1 leaves: fresh digits through the same drift, judged by the new champion's detector
            from scanflow.examples.digits.s1 import post_drift_pool

            traffic.drift_pool = post_drift_pool()
            switched = time.time()
            ctx.say(f"S1: fresh drifted digits to v{new}; its detector should read them as clean")

            from scanflow.agentkit.env import drift_window

            tracker = next(a for a in stack.workflow.agents if a.role == "tracker")
            straddle_s = 5.0 + drift_window(tracker, ctx.quick) / RATE  # a window of rows sent before the switch

            def fresh() -> list[dict[str, Any]]:
                return post_swap_checks(stack.events("checker", limit=1000), str(new), switched + straddle_s)

            wait_for(lambda: len(fresh()) >= POST_WINDOWS, 90, interval_s=1.0)
            post = fresh()[:POST_WINDOWS]
        checker_events = stack.events("checker", limit=1000)
        plans = stack.get("planner", "/plans")
    served_at = min((a.t for a in traffic.snapshot() if new and a.version == new), default=float("nan"))
    from scanflow.tracking.registry import promotion_history

    moves = [m for m in promotion_history(MODEL, "champion") if new and str(m.get("version")) == new]
    acc = {
        "clean, old model": traffic.accuracy(drifted=False, version=old),
        "drifted, old model": traffic.accuracy(drifted=True, version=old),
        "drifted, new model": traffic.accuracy(drifted=True, version=new) if new else float("nan"),
    }
    failed = len(traffic.failed())
    series = drift_series(checker_events, t0)
    res.decisions = [decision_line(str(d.get("policy")), str(d.get("reason", ""))) for d in plans
                     if d.get("policy") == "retrain" and d.get("retrain")]
    res.decisions += [decision_line(f"promote v{m.get('version')}", str(m.get("reason", ""))) for m in moves]
    res.figures = {
        "old_version": old, "new_version": new, "requests": traffic.count(), "failed": failed,
        "onset_to_serving_s": round(served_at - onset, 1) if new else None,
        "windows_checked": len(series["t"]), "windows_drifted": sum(series["drift"]),
        "accuracy_clean_old": acc["clean, old model"], "accuracy_drifted_old": acc["drifted, old model"],
        "accuracy_drifted_new": acc["drifted, new model"],
    }
    post_flagged = sum(bool(e["payload"].get("drift")) for e in post)
    res.figures["post_swap_windows"] = len(post)
    res.figures["post_swap_flagged"] = post_flagged
    res.passed = (new is not None and failed == 0
                  and acc["drifted, new model"] > acc["drifted, old model"]
                  and len(post) >= POST_WINDOWS and post_flagged <= MAX_POST_FLAGGED)
    res.series = {"drift": series, "marks": {"drift onset": onset - t0,
                                             **({"new champion serves": served_at - t0} if new else {})},
                  "accuracy": acc,
                  # the Checker's threshold: a window drifts when its p-value is below the detector's fpr
                  "fpr": detector_options(stack.workflow, ctx.quick).fpr}
    return res
