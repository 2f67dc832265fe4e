"""The strategy engine, in pure stages: match -> evaluate (constraint, dedup, cooldown, rate limit) -> intents.

No I/O, no clock, no `self`: the caller passes the event, the strategies, each strategy's
`StrategyState` and `now`, and gets back decisions (why each strategy fired or not), the action
intents to execute (each with a deterministic idempotency key `f"{strategy}:{event_id}:{i}"`) and the
new states. So a restart loses nothing (the runtime persists the states with the decisions in one
transaction) and tests replay scripted sequences with an explicit `now`.

Who calls: scanflow.agent.runtime (once per inbox event), benchmarks/agent_events.py, tests/agent/test_engine.py.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from scanflow.agent.types import Action, Event, Strategy
from scanflow.expressions import Expression, ExpressionError

RATE_WINDOW_S = 60.0

DecisionResult = Literal["fired", "skipped", "error"]


@dataclass(frozen=True)
class StrategyState:
    """What one strategy remembers between events (persisted; never kept on an object)."""

    last_fired: float | None = None
    recent: tuple[float, ...] = ()  # firing times inside the rate window, oldest first
    last_event_id: int = 0  # highest event id already evaluated: replays are refused ('duplicate')

    def to_json(self) -> dict[str, Any]:
        return {
            "last_fired": self.last_fired,
            "recent": list(self.recent),
            "last_event_id": self.last_event_id,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StrategyState:
        return cls(
            last_fired=data.get("last_fired"),
            recent=tuple(float(t) for t in data.get("recent", ())),
            last_event_id=int(data.get("last_event_id", 0)),
        )


@dataclass(frozen=True)
class Intent:
    """An action to execute for one event, with the key that makes executing it idempotent."""

    key: str
    strategy: str
    event_id: int
    index: int
    action: Action

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "strategy": self.strategy,
            "event_id": self.event_id,
            "index": self.index,
            "actuator": self.action.actuator,
            "agent": self.action.agent,
            "args": self.action.args,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Intent:
        return cls(
            key=data["key"],
            strategy=data["strategy"],
            event_id=int(data["event_id"]),
            index=int(data["index"]),
            action=Action(data["actuator"], data.get("agent"), dict(data.get("args") or {})),
        )


@dataclass(frozen=True)
class Decision:
    """Why a strategy fired or not for one event: inputs, constraint text, result, reason, intents."""

    event_id: int
    event_name: str
    strategy: str
    constraint: str
    result: DecisionResult
    reason: str  # 'fired' | 'false' | 'cooldown' | 'rate-limited' | 'duplicate' | error message
    inputs: dict[str, Any]
    intents: tuple[Intent, ...] = ()
    at: float = 0.0


@dataclass(frozen=True)
class EvalEnv:
    """What a constraint may read besides the event: the agent state, `since(action)`, the context.

    `ctx` is handed only to callable constraints (`fn(ctx, event)`); expressions see names only.
    """

    state: Mapping[str, Any] = field(default_factory=dict)
    since: Callable[[str], float] = lambda _name: math.inf
    ctx: Any = None


@dataclass(frozen=True)
class Plan:
    """The engine's answer for one event."""

    decisions: tuple[Decision, ...]
    intents: tuple[Intent, ...]
    states: dict[str, StrategyState]


def intent_key(strategy: str, event_id: int, index: int) -> str:
    return f"{strategy}:{event_id}:{index}"


def event_matches(event_name: str, pattern: str) -> bool:
    """Does a strategy's event (exact name or glob: `drift.*`, `*`) match this event name? The one rule,
    shared by `match` and by `scanflow validate` (scanflow.validation)."""
    return pattern == event_name or fnmatch.fnmatchcase(event_name, pattern)


def match(event_name: str, strategies: Iterable[Strategy]) -> list[Strategy]:
    """Strategies whose event glob (`drift.*`, `plan.approved`, `*`) matches the event name, in order."""
    return [s for s in strategies if event_matches(event_name, s.event)]


def evaluates_code(event_name: str, strategies: Iterable[Strategy]) -> bool:
    """Pure: does this event reach a constraint that needs evaluating (an expression that is not a
    constant such as 'True', or a callable)? The runtime then runs `decide` off its event loop;
    events that match nothing or only constant constraints skip the thread hop."""
    for s in match(event_name, strategies):
        c = s.constraint
        if not (isinstance(c, Expression) and c.is_constant):
            return True
    return False


def _constraint_holds(strategy: Strategy, event: Event, now: float, env: EvalEnv) -> bool:
    c = strategy.constraint
    if isinstance(c, Expression):
        return c.test(event=event.payload, state=env.state, now=now, since=env.since)
    return bool(c(env.ctx, event))


def evaluate(
    strategy: Strategy, event: Event, st: StrategyState, now: float, env: EvalEnv
) -> tuple[Decision, StrategyState]:
    """One strategy against one event: the decision and the strategy's new state.

    Order: duplicate (event already evaluated) -> constraint -> cooldown -> rate limit. The constraint
    is evaluated before the guards so a decision says "would have fired, but cooldown".
    """
    # Firing times are kept only for a rate-limited strategy, and only those inside the window.
    limited = strategy.max_per_minute is not None
    recent = tuple(t for t in st.recent if now - t < RATE_WINDOW_S) if limited and st.recent else ()
    inputs: dict[str, Any] = {
        "event": event.payload,
        "now": now,
        "last_fired": st.last_fired,
        "fired_last_minute": len(recent),
    }

    def decision(result: DecisionResult, reason: str, intents: tuple[Intent, ...] = ()) -> Decision:
        return Decision(
            event.id,
            event.name,
            strategy.name,
            strategy.constraint_text,
            result,
            reason,
            inputs,
            intents,
            now,
        )

    if event.id and event.id <= st.last_event_id:
        return decision("skipped", "duplicate"), st
    seen = StrategyState(st.last_fired, recent, max(st.last_event_id, event.id))
    try:
        holds = _constraint_holds(strategy, event, now, env)
    except ExpressionError as exc:
        return decision("error", str(exc)), seen
    except Exception as exc:  # noqa: BLE001 - a user's callable constraint: record, never crash the loop
        return decision("error", f"constraint raised {type(exc).__name__}: {exc}"), seen
    if not holds:
        return decision("skipped", "false"), seen
    if st.last_fired is not None and strategy.cooldown_s > 0 and now - st.last_fired < strategy.cooldown_s:
        inputs["cooldown_left_s"] = strategy.cooldown_s - (now - st.last_fired)
        return decision("skipped", "cooldown"), seen
    if limited and len(recent) >= strategy.max_per_minute:  # type: ignore[operator]
        return decision("skipped", "rate-limited"), seen
    intents = tuple(
        Intent(intent_key(strategy.name, event.id, i), strategy.name, event.id, i, a)
        for i, a in enumerate(strategy.actions)
    )
    fired = StrategyState(now, (*recent, now) if limited else (), seen.last_event_id)
    return decision("fired", "fired", intents), fired


def decide(
    event: Event,
    strategies: Iterable[Strategy],
    states: Mapping[str, StrategyState],
    now: float,
    env: EvalEnv | None = None,
) -> Plan:
    """All matching strategies against one event -> decisions, intents (in strategy order), new states.

    `states` is not modified; the returned `Plan.states` holds every state (changed or not).
    """
    env = env or EvalEnv()
    new_states = dict(states)
    decisions: list[Decision] = []
    intents: list[Intent] = []
    for strategy in match(event.name, strategies):
        d, st = evaluate(strategy, event, new_states.get(strategy.name, StrategyState()), now, env)
        new_states[strategy.name] = st
        decisions.append(d)
        intents.extend(d.intents)
    return Plan(tuple(decisions), tuple(intents), new_states)
