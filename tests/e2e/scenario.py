"""The S1 drift scenario as a function, shared by the S1 test and the reliability test (and mirrored by
benchmarks/s1.py): clean traffic, drift onset, wait for a new champion to serve."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from e2e_support import wait_for

from scanflow.stack import EmbeddedStack, Traffic


@dataclass
class S1Result:
    onset: float
    served_at: float
    old_version: str
    new_version: str
    promotions: list[dict[str, Any]] = field(default_factory=list)


def champion(stack: EmbeddedStack, model: str = "digits") -> str | None:
    import mlflow

    from scanflow.tracking.registry import CHAMPION, get_alias_version

    mlflow.set_tracking_uri(stack.tracking_uri)
    return get_alias_version(model, CHAMPION)


def run_s1(stack: EmbeddedStack, traffic: Traffic, timeout_s: float = 170.0,
           during: Callable[[], None] | None = None, on_onset: Callable[[], None] | None = None,
           model: str = "digits") -> S1Result:
    """Clean traffic until the service answers, then drift; returns when the new champion of `model` serves.

    `on_onset` runs right after the drift starts (the reliability test starts its chaos there).
    """
    old = wait_for(lambda: champion(stack, model), 30, what="the bootstrap champion")
    wait_for(lambda: traffic.count() > 50, 60, what="clean traffic answered")
    onset = time.time()
    traffic.drifted = True
    if on_onset is not None:
        on_onset()

    def new_version_serves() -> str | None:
        if during is not None:
            during()
        cur = champion(stack, model)
        if cur is None or cur == old:
            return None
        recent = [a for a in traffic.snapshot()[-20:] if a.status == 200]
        return cur if recent and all(a.version == cur for a in recent) else None

    new = wait_for(new_version_serves, timeout_s, what="a new champion serving after the drift onset")
    served = min(a.t for a in traffic.snapshot() if a.version == new)
    from scanflow.tracking.registry import promotion_history

    return S1Result(onset, served, old, new, promotion_history(model, "champion"))
