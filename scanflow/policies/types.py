"""The few types every Planner policy shares: a decision record and a consecutive-tick counter.

Who uses it: every module of `scanflow.policies` (autoscale, hpa, retrain, failover, tune), and the
Planner agent, which stores `Decision.to_dict()` in its durable event store so each decision says why
it was taken and from which inputs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from pydantic import TypeAdapter

Direction = Literal[-1, 0, 1]


@dataclass(frozen=True)
class Decision:
    """Base of every policy decision: what was decided, why (`reason`) and from which `inputs`."""

    reason: str
    inputs: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (nested dataclasses and tuples flattened) for stores and logs."""
        return _plain(dataclasses.asdict(self))


def slo_breached(latency_ms: float | None, slo_ms: float, lower_bound: bool = False) -> bool:
    """Pure: whether a measured latency percentile breaks a latency SLO: above it, or at it when the
    figure is only a lower bound (the percentile fell past the histogram's top bucket, so the true
    value may be anywhere above). No measurement (no request completed) is no breach. The one rule the
    Checker (its `breached` flag) and the scaling policies judge by."""
    return latency_ms is not None and (latency_ms > slo_ms or (lower_bound and latency_ms >= slo_ms))


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and math.isnan(value):  # NaN is not JSON
        return None
    return value


@dataclass(frozen=True)
class Streak:
    """How many consecutive ticks pointed the same way, and since when.

    A change of direction resets the count to 1 (or 0 for direction 0): the hysteresis of every
    policy (scale up/down, failover, recover) is built on this one counter.
    """

    direction: int = 0
    count: int = 0
    since: float | None = None

    def update(self, direction: int, now: float) -> Streak:
        if direction == 0:
            return Streak(0, 0, None)
        if direction == self.direction and self.since is not None:
            return Streak(direction, self.count + 1, self.since)
        return Streak(direction, 1, now)

    def age(self, now: float) -> float:
        """Seconds since the streak began (0 when there is none)."""
        return 0.0 if self.since is None else max(0.0, now - self.since)


S = TypeVar("S")
_STATE_ADAPTERS: dict[type, TypeAdapter[Any]] = {}


def _state_adapter(cls: type) -> TypeAdapter[Any]:
    got = _STATE_ADAPTERS.get(cls)
    if got is None:
        got = _STATE_ADAPTERS[cls] = TypeAdapter(cls)
    return got


def state_to_json(state: Any, *, exclude: set[str] | None = None) -> dict[str, Any]:
    """A policy's state (a frozen dataclass) as plain JSON, for the agent's store between ticks and
    restarts. The dataclass is the schema: no hand-written field list to keep in step with it."""
    out: dict[str, Any] = _state_adapter(type(state)).dump_python(state, mode="json", exclude=exclude)
    return out


def state_from_json(cls: type[S], data: Mapping[str, Any]) -> S:
    """The state back from `state_to_json`: missing fields at their defaults (a first tick, a state
    written before the field existed), unknown ones ignored (written by a newer version), tuples from
    JSON lists. A value of the wrong type raises pydantic's ValidationError naming the field."""
    state: S = _state_adapter(cls).validate_python(dict(data))
    return state

