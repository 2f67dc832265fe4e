"""Helpers of the end-to-end scenarios: a poll-until helper, decision counting, the digits workflow as
S1/S4 run it. A module of its own name: `from conftest import` is ambiguous when several test folders
are collected in one run (another folder's conftest can win).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest


def wait_for(cond: Callable[[], Any], timeout_s: float, interval_s: float = 0.5, what: str = "condition") -> Any:
    """Poll `cond` until it returns something truthy; fail the test with `what` after the deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(interval_s)
    pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}")


def count_ok(decisions_or_actions: list[dict[str, Any]], **match: Any) -> int:
    return sum(all(d.get(k) == v for k, v in match.items()) for d in decisions_or_actions)


def digits_workflow(without: tuple[str, ...] = ("autoscale",)):  # type: ignore[no-untyped-def]
    """The digits workflow with some Planner strategies left out (see `without_planner_strategies`)."""
    from scanflow.examples.digits.workflow import workflow

    return without_planner_strategies(workflow, without)


def without_planner_strategies(workflow, without: tuple[str, ...] = ("autoscale",)):  # type: ignore[no-untyped-def]
    """`workflow` with some Planner strategies left out.

    S1 and S4 run with autoscaling off: on 2 shared cores the SLO of 50 ms p99 is breached by every
    training job or model load, and the scenarios are about drift and failover, not replica counts.
    """
    agents = []
    for a in workflow.agents:
        if a.role == "planner":
            a = a.model_copy(update={"strategies": [s for s in a.strategies if s.name not in without]})
        agents.append(a)
    return workflow.model_copy(update={"agents": agents})


def with_retrain_cooldown(workflow, seconds: float):  # type: ignore[no-untyped-def]
    """`workflow` whose Planner may plan a retrain every `seconds` (its policy's cooldown and the
    `retrain-on-drift` strategy's): a second retrain after S1 then is the drift rule's doing, not held
    back by the default 600 s."""
    agents = []
    for a in workflow.agents:
        if a.role == "planner":
            settings = {**a.settings, "retrain": {**a.settings.get("retrain", {}), "cooldown_s": seconds}}
            strategies = [s.model_copy(update={"cooldown_s": seconds, "constraint": f"since('submit_plan') > {seconds:g}"})
                          if s.name == "retrain-on-drift" else s for s in a.strategies]
            a = a.model_copy(update={"settings": settings, "strategies": strategies})
        agents.append(a)
    return workflow.model_copy(update={"agents": agents})


def fresh_checks(checks: list[dict[str, Any]], since: float, window_s: float) -> list[dict[str, Any]]:
    """Drift checks received after `since` + `window_s` + 5 s: windows made only of rows sent after `since`
    (a window's rows arrive over `window_s`; the Tracker's flush and the check take a few seconds more)."""
    return [c for c in checks if float(c.get("received_at") or 0) > since + window_s + 5.0]


POST_SWAP_WINDOWS = 10  # fresh post-drift windows judged by the new champion's detector
# of 10 fresh windows at the detector's 5 % false-positive rate, 3 or more flagged happens in ~1 % of runs
MAX_FLAGGED = 2
STABLE_S = 300.0  # fresh post-drift traffic with feedback after the promotion: no second retrain in it
RETRAIN_COOLDOWN_S = 60.0


@contextmanager
def busy_core() -> Iterator[int]:
    """One core kept busy by a background process for the block (a spin loop, unpinned: the scheduler
    puts it where it likes, as other work on a shared machine would be); yields its pid and stops it
    (by that pid) at the end, whatever happened."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait(timeout=10)
