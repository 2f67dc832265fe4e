"""The shipped workflows with `delivery: progressive` and short stages, as the delivery e2e tests run them."""

from __future__ import annotations

from typing import Any

from e2e_support import without_planner_strategies

from scanflow.spec import Delivery

CANARY_SHARE = 0.3
DELIVERY = Delivery.model_validate({"mode": "progressive", "stages": [
    {"kind": "shadow", "share": 1.0, "min_labelled": 100, "min_seconds": 10, "timeout_s": 300},
    {"kind": "canary", "share": CANARY_SHARE, "min_labelled": 20, "min_seconds": 10, "timeout_s": 300}]})


def delivery_workflow(example: str = "digits") -> Any:
    """The shipped workflow `example` (digits, sensors; autoscaling off, as S1 runs) whose primary service (named
    like the workflow) declares DELIVERY."""
    import importlib

    wf = without_planner_strategies(importlib.import_module(f"scanflow.examples.{example}.workflow").workflow)
    services = [s.model_copy(update={"delivery": DELIVERY}) if s.name == example else s for s in wf.services]
    return wf.model_copy(update={"services": services})
