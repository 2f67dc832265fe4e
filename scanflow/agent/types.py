"""The core value types of the agent runtime; every other module of scanflow.agent imports from here.

Events, actions, outcomes and the frozen specs that the `Agent` decorators register. Plain frozen
dataclasses: cheap to build in the hot path, easy to compare in tests, converted to JSON at the edge.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from scanflow.spec import ActionSpec

if TYPE_CHECKING:
    from scanflow.agent.context import Context
    from scanflow.expressions import Expression


@dataclass(frozen=True)
class Event:
    """A named state change with a JSON payload. `id` orders the inbox; `key` deduplicates it."""

    name: str
    payload: dict[str, Any] = field(default_factory=dict)
    id: int = 0
    key: str | None = None
    source: str | None = None
    received_at: float = 0.0

    def to_ref(self) -> dict[str, Any]:
        """What a peer's actuator receives as its `ctx.event` (no idempotency key: it is ours)."""
        return {"id": self.id, "name": self.name, "payload": self.payload, "source": self.source}

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "payload": self.payload,
            "idempotency_key": self.key,
            "source": self.source,
            "received_at": self.received_at,
        }


@dataclass(frozen=True)
class Action:
    """One action of a strategy: a local actuator, or `agent=` another agent's actuator over REST.

    `Action("plan_retrain")`, `Action("scale", agent="executor", args={"replicas": 3})`.
    """

    actuator: str
    agent: str | None = None
    args: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_spec(cls, spec: ActionSpec) -> Action:
        return cls(spec.actuator, spec.agent, dict(spec.args))

    def to_spec(self) -> ActionSpec:
        return ActionSpec(actuator=self.actuator, agent=self.agent, args=self.args)


OutcomeStatus = Literal["ok", "retry", "failed"]


@dataclass(frozen=True)
class Outcome:
    """What an action did, as a value: ok (with result), retry (temporary, after a delay) or failed.

    The runtime never lets a handler exception escape into its loop; it converts it to an Outcome.
    """

    status: OutcomeStatus
    result: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    retry_after_s: float = 0.0

    @classmethod
    def ok(cls, result: dict[str, Any] | None = None) -> Outcome:
        return cls("ok", dict(result or {}))

    @classmethod
    def retry(cls, error: str, delay_s: float = 1.0) -> Outcome:
        return cls("retry", {}, error, max(0.0, delay_s))

    @classmethod
    def failed(cls, error: str) -> Outcome:
        return cls("failed", {}, error)

    @property
    def final(self) -> bool:
        return self.status != "retry"


class TemporaryError(Exception):
    """Raise from an actuator to ask for a retry after `delay_s` (bounded by the runtime's limit)."""

    def __init__(self, message: str, delay_s: float = 1.0) -> None:
        super().__init__(message)
        self.delay_s = delay_s


class PermanentError(Exception):
    """Raise from an actuator to stop: the action is recorded as failed and not retried."""


SensorFn = Callable[["Context"], Any]
ActuatorFn = Callable[["Context", dict[str, Any]], Any]
ConstraintFn = Callable[["Context", Event], bool]
Hook = Callable[["Context"], Awaitable[None] | None]


@dataclass(frozen=True)
class SensorSpec:
    """A registered sensor: `fn(ctx)` every `every` seconds, returning events (or None).

    `emits`: the event names it may return, declared so `scanflow validate` can tell that a
    strategy's event is produced by someone."""

    name: str
    fn: SensorFn
    every: float
    is_async: bool
    emits: tuple[str, ...] = ()


@dataclass(frozen=True)
class ActuatorSpec:
    """A registered actuator: `fn(ctx, args) -> dict`; sync ones run in a thread pool.

    `emits`: the event names it may emit (to its own inbox or a peer's), for `scanflow validate`."""

    name: str
    fn: ActuatorFn
    is_async: bool
    max_attempts: int = 3
    emits: tuple[str, ...] = ()


@dataclass(frozen=True)
class Strategy:
    """A compiled strategy: event glob, a constraint (safe expression or callable), actions, guards."""

    name: str
    event: str
    constraint_text: str
    constraint: Expression | ConstraintFn
    actions: tuple[Action, ...]
    cooldown_s: float = 0.0
    max_per_minute: float | None = None
    source: Literal["code", "rest"] = "code"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "event": self.event,
            "constraint": self.constraint_text,
            "actions": [a.to_spec().model_dump(mode="json") for a in self.actions],
            "cooldown_s": self.cooldown_s,
            "max_per_minute": self.max_per_minute,
            "source": self.source,
        }
