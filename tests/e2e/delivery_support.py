"""The digits workflow with `delivery: progressive` and short stages, as the delivery e2e tests run it."""

from __future__ import annotations

from typing import Any

from e2e_support import digits_workflow

from scanflow.spec import Delivery

CANARY_SHARE = 0.3
DELIVERY = Delivery.model_validate({"mode": "progressive", "stages": [
    {"kind": "shadow", "share": 1.0, "min_labelled": 100, "min_seconds": 10, "timeout_s": 300},
    {"kind": "canary", "share": CANARY_SHARE, "min_labelled": 20, "min_seconds": 10, "timeout_s": 300}]})


def delivery_workflow() -> Any:
    """The digits workflow (autoscaling off) whose `digits` service declares DELIVERY."""
    wf = digits_workflow()
    services = [s.model_copy(update={"delivery": DELIVERY}) if s.name == "digits" else s for s in wf.services]
    return wf.model_copy(update={"services": services})
