"""Agents served as real processes by the agent tests (`scanflow agent run sample_agents.py --name ...`).

Effects go to files in $SCANFLOW_TEST_OUT so the test can count them after SIGKILLs.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from scanflow.agent import Action, Agent, Context

OUT = Path(os.environ.get("SCANFLOW_TEST_OUT", "."))


def _append(name: str, line: str) -> None:
    with open(OUT / name, "a") as f:
        f.write(line + "\n")  # page cache survives a SIGKILL: no fsync needed for this test


# -- planner -> executor over REST ------------------------------------------------------------------
planner = Agent("planner", role="planner")
planner.strategy(
    "scale-on-latency",
    event="latency.breached",
    constraint="event.p99_ms > 50",
    actions=[Action("scale", agent="executor", args={"replicas": 3})],
)

executor = Agent("executor", role="executor")


@executor.actuator("scale")
def scale(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    p99 = ctx.event.payload["p99_ms"] if ctx.event is not None else None  # the planner's triggering event
    _append("scale.log", f"{ctx.key} {args['replicas']} {p99}")
    return {"replicas": args["replicas"]}


# -- worker: the SIGKILL test ------------------------------------------------------------------------
worker = Agent("worker")
worker.strategy("on-tick", event="tick", actions=[Action("apply"), Action("apply", args={"second": True})])


@worker.actuator("apply")
def apply(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Logs every invocation; applies its effect once per key (the actuator's side of idempotency)."""
    assert ctx.key is not None
    _append("invocations.log", ctx.key)
    time.sleep(0.003)  # a window in which a SIGKILL lands mid-action
    effects = OUT / "effects.log"
    done = set(effects.read_text().split()) if effects.exists() else set()
    if ctx.key not in done:
        _append("effects.log", ctx.key)
    return {"applied": ctx.key}


# -- evaluator: the responsiveness test (heavy constraints are added over REST) ---------------------
evaluator = Agent("evaluator")


@evaluator.actuator("noop")
def noop(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    return {}
