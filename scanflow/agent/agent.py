"""`Agent`: the registry an agent author fills with decorators; importing a file starts nothing.

    agent = Agent("checker", role="checker")

    @agent.sensor(every=5.0, emits=("drift.checked",))
    async def poll(ctx): return [("drift.checked", {"drift_rate": 0.2})]

    @agent.actuator("plan_retrain")
    def plan_retrain(ctx, args): return {"planned": True}

    agent.strategy("retrain", event="drift.*",
                   constraint="event.drift_rate > 0.1 and since('plan_retrain') > 600",
                   actions=[Action("plan_retrain")], cooldown_s=60)

Decorators only build frozen specs (scanflow.agent.types) and return the function unchanged; the
runtime (scanflow.agent.runtime) and the app factory (scanflow.agent.app) bring them to life.
Who calls: agent authors (scanflow/standard/*.py, examples, tests), `scanflow agent run FILE`.
"""

from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, TypeVar

from fastapi import APIRouter
from pydantic import ValidationError

from scanflow.agent.types import (
    Action,
    ActuatorSpec,
    ConstraintFn,
    Hook,
    SensorSpec,
    Strategy,
)
from scanflow.expressions import ExpressionError, compile_expression
from scanflow.spec import NAME_RE, ActionSpec, AgentSpec, StrategySpec, Workflow

F = TypeVar("F", bound=Callable[..., Any])
Role = Literal["tracker", "checker", "planner", "executor", "custom"]
_HANDLER_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")
_EVENT_NAME = re.compile(r"^[A-Za-z0-9_.:/-]{1,200}$")
ActionLike = Action | ActionSpec | str | dict[str, Any]
# builds routes once the app's settings are known: (settings, the runtime's resources) -> router
RouterFactory = Callable[[Any, dict[str, Any]], APIRouter]

log = logging.getLogger(__name__)


class AgentDefinitionError(ValueError):
    """An agent declaration is wrong (bad name, duplicate handler, invalid constraint...)."""


def _as_action(a: ActionLike) -> Action:
    if isinstance(a, Action):
        return a
    if isinstance(a, ActionSpec):
        return Action.from_spec(a)
    if isinstance(a, str):
        return Action(a)
    if isinstance(a, dict):
        return Action.from_spec(ActionSpec.model_validate(a))
    raise AgentDefinitionError(f"an action must be Action, ActionSpec, str or dict, got {type(a).__name__}")


def build_strategy(
    name: str,
    event: str,
    constraint: str | ConstraintFn = "True",
    actions: Sequence[ActionLike] = (),
    cooldown_s: float = 0.0,
    max_per_minute: float | None = None,
    source: Literal["code", "rest"] = "code",
) -> Strategy:
    """Validate (via StrategySpec) and compile a strategy; raises AgentDefinitionError saying why."""
    acts = tuple(_as_action(a) for a in actions)
    text = constraint if isinstance(constraint, str) else f"<callable {getattr(constraint, '__name__', '?')}>"
    try:
        StrategySpec(
            name=name,
            event=event,
            constraint=text if isinstance(constraint, str) else "True",
            actions=[a.to_spec() for a in acts],
            cooldown_s=cooldown_s,
            max_per_minute=max_per_minute,
        )
    except ValidationError as exc:  # reformat into one readable message
        raise AgentDefinitionError(f"strategy {name!r}: {exc}") from None
    if isinstance(constraint, str):
        try:
            compiled: Any = compile_expression(constraint)
        except ExpressionError as exc:
            raise AgentDefinitionError(f"strategy {name!r}: {exc}") from None
    elif callable(constraint):
        compiled = constraint
    else:
        raise AgentDefinitionError(f"strategy {name!r}: constraint must be a string or a callable")
    return Strategy(name, event, text, compiled, acts, float(cooldown_s), max_per_minute, source)


def _names(what: str, values: Iterable[str]) -> tuple[str, ...]:
    """A tuple of non-empty strings (a lone string is refused: ("x") is a common slip for ("x",))."""
    if isinstance(values, str):
        raise AgentDefinitionError(f"{what} must be a list or tuple of names, got the string {values!r}")
    out = tuple(values)
    for v in out:
        if not isinstance(v, str) or not v.strip():
            raise AgentDefinitionError(f"{what}: every name must be a non-empty string, got {v!r}")
    return out


def _event_names(owner: str, values: Iterable[str]) -> tuple[str, ...]:
    """Declared event names: exact names, since a strategy's glob is matched against them."""
    out = _names(f"{owner} emits", values)
    for v in out:
        if any(c in v for c in "*?["):
            raise AgentDefinitionError(f"{owner} emits {v!r}: declare exact event names, not patterns")
    return out


class Agent:
    """The declaration of one agent: sensors, actuators, strategies, extra routes and hooks."""

    def __init__(
        self,
        name: str,
        role: Role = "custom",
        *,
        description: str = "",
        max_body_bytes: int | None = None,
        emits: Iterable[str] = (),
        settings_keys: Iterable[str] | None = None,
        messages: Mapping[str, Any] | None = None,
        needs_workflow: bool = False,
    ) -> None:
        """`max_body_bytes`: the largest request body the app accepts (default 1 MiB); an agent whose
        router takes big uploads (the Tracker's /predictions) raises it here, where its code lives.

        `emits`: event names this agent produces outside its sensors and actuators (its routes, hooks);
        those two declare theirs on their decorators. `settings_keys`: the top-level keys of its
        AgentSpec.settings it reads (None: it does not say, and they are not checked). Both are read by
        `scanflow validate` (scanflow.validation), never by the runtime.

        `messages`: event name -> the pydantic model (or annotated union) of the payload this agent
        receives from its peers (scanflow.messages for the standard agents). POST /events validates each
        such event and answers a payload that does not fit with a 422 naming the field; an agent that
        declares messages takes only those by POST (any other is a 422 naming the ones it takes), and
        its OpenAPI document describes each. Events it emits itself are not affected.

        `needs_workflow`: its handlers read `ctx.workflow` / `ctx.spec`, so it serves only once bound to
        a workflow (`bound`; `scanflow agent run` binds it to SCANFLOW_WORKFLOW). Nothing is read from
        the workflow when the module is imported: one process can load it for several workflows."""
        if not re.match(NAME_RE, name) or len(name) > 63:
            raise AgentDefinitionError(
                f"agent name {name!r} must be a DNS label: lowercase letters, digits and '-', "
                "starting and ending with a letter or digit, at most 63 characters"
            )
        self.name = name
        self.role: Role = role
        self.description = description
        if max_body_bytes is not None and max_body_bytes <= 0:
            raise AgentDefinitionError(f"max_body_bytes must be positive, got {max_body_bytes}")
        self.max_body_bytes = max_body_bytes
        self.emits = _event_names("agent", emits)
        self.settings_keys = None if settings_keys is None else _names("settings_keys", settings_keys)
        self.messages: dict[str, Any] = dict(messages or {})
        for event in self.messages:
            if not isinstance(event, str) or not _EVENT_NAME.match(event):
                raise AgentDefinitionError(f"messages: event name {event!r} must match [A-Za-z0-9_.:/-]{{1,200}}")
        self.sensors: dict[str, SensorSpec] = {}
        self.actuators: dict[str, ActuatorSpec] = {}
        self.strategies: dict[str, Strategy] = {}
        self.router = APIRouter()
        self.router_factories: list[RouterFactory] = []
        self.startup_hooks: list[Hook] = []
        self.shutdown_hooks: list[Hook] = []
        self.needs_workflow = needs_workflow
        self.workflow: Workflow | None = None
        self.spec: AgentSpec | None = None

    def bound(self, workflow: Workflow, spec: AgentSpec | None = None) -> Agent:
        """A copy of this agent serving `workflow` as `spec` (default: the workflow's agent of this name,
        else the only one of this role): named after the spec, with the spec's strategies added after the
        code's own. Handlers see both as `ctx.workflow` and `ctx.spec`. This agent is left unchanged, so
        one imported module can be bound to several workflows (validation does so).

        Raises AgentDefinitionError when the workflow declares no such agent, or a strategy of the spec
        clashes with one of the code's."""
        spec = spec or self._spec_in(workflow)
        copy = Agent.__new__(Agent)
        copy.__dict__.update(self.__dict__)
        copy.name, copy.workflow, copy.spec = spec.name, workflow, spec
        # containers of its own: registering on one copy (or on this agent later) leaves the others alone
        # bound again: the earlier spec's strategies give way to the new spec's; the code's own stay
        earlier = {s.name for s in self.spec.strategies} if self.spec is not None else set()
        own = {name: s for name, s in self.strategies.items() if name not in earlier}
        copy.sensors, copy.actuators, copy.strategies = dict(self.sensors), dict(self.actuators), own
        copy.startup_hooks, copy.shutdown_hooks = list(self.startup_hooks), list(self.shutdown_hooks)
        copy.router_factories, copy.messages = list(self.router_factories), dict(self.messages)
        for strategy in spec.strategies:
            copy.add_strategy(strategy)
        return copy

    def _spec_in(self, workflow: Workflow) -> AgentSpec:
        by_name = [a for a in workflow.agents if a.name == self.name]
        by_role = [a for a in workflow.agents if self.role != "custom" and a.role == self.role]
        found = by_name or by_role
        if len(found) != 1:
            why = "several" if found else "no"
            raise AgentDefinitionError(
                f"workflow {workflow.name!r} declares {why} agent named {self.name!r}"
                + (f" or with role {self.role!r}" if self.role != "custom" else "")
                + f" (it has {[a.name for a in workflow.agents]})"
            )
        return found[0]

    def routes(self, factory: RouterFactory) -> RouterFactory:
        """Register `factory(settings, resources) -> APIRouter`, called when the app is built: for routes
        that need the app's settings (a token) or objects opened at startup (kept in `resources`, the
        same dict handlers see as `ctx.resources`), so that importing the module reads nothing."""
        self.router_factories.append(factory)
        return factory

    def __repr__(self) -> str:
        return (
            f"Agent({self.name!r}, role={self.role!r}, sensors={sorted(self.sensors)}, "
            f"actuators={sorted(self.actuators)}, strategies={sorted(self.strategies)})"
        )

    @staticmethod
    def _check_name(kind: str, name: str, taken: Iterable[str]) -> None:
        if not _HANDLER_NAME.match(name):
            raise AgentDefinitionError(f"{kind} name {name!r} must match [A-Za-z0-9_.-]{{1,100}}")
        if name in taken:
            raise AgentDefinitionError(f"{kind} {name!r} is already registered")

    def sensor(
        self, every: float = 5.0, *, name: str | None = None, emits: Iterable[str] = ()
    ) -> Callable[[F], F]:
        """Register `fn(ctx) -> list[Event | (name, payload)] | None`, run every `every` seconds.

        Also callable on demand: `POST /sensors/{name}`. `every=0` means on demand only.
        `emits`: the event names it returns (for `scanflow validate`).
        """
        if every < 0:
            raise AgentDefinitionError(f"sensor every={every} must be >= 0 seconds")
        events = _event_names("sensor", emits)

        def register(fn: F) -> F:
            n = name or fn.__name__
            self._check_name("sensor", n, self.sensors)
            self.sensors[n] = SensorSpec(n, fn, float(every), inspect.iscoroutinefunction(fn), events)
            return fn

        return register

    def actuator(
        self, name: str | None = None, *, max_attempts: int = 3, emits: Iterable[str] = ()
    ) -> Callable[[F], F]:
        """Register `fn(ctx, args: dict) -> dict`: an action this agent can do (sync ones run in threads).

        `ctx.key` is the action's idempotency key: an actuator with outside effects should use it so
        that a retry after a crash does not repeat the effect. Raise TemporaryError to be retried
        (up to `max_attempts` times with backoff), PermanentError to stop. `emits`: the event names
        it emits or sends to peers (for `scanflow validate`).
        """
        if max_attempts < 1:
            raise AgentDefinitionError(f"max_attempts={max_attempts} must be >= 1")
        events = _event_names("actuator", emits)

        def register(fn: F) -> F:
            n = name or fn.__name__
            self._check_name("actuator", n, self.actuators)
            self.actuators[n] = ActuatorSpec(n, fn, inspect.iscoroutinefunction(fn), max_attempts, events)
            return fn

        return register

    def strategy(
        self,
        name: str,
        event: str,
        constraint: str | ConstraintFn = "True",
        actions: Sequence[ActionLike] = (),
        cooldown_s: float = 0.0,
        max_per_minute: float | None = None,
    ) -> Strategy:
        """Register event -> constraint -> actions. An invalid constraint is refused here, not at firing."""
        self._check_name("strategy", name, self.strategies)
        s = build_strategy(name, event, constraint, actions, cooldown_s, max_per_minute)
        self.strategies[name] = s
        return s

    def add_strategy(self, spec: StrategySpec) -> Strategy:
        """Register a declarative strategy (from a workflow's AgentSpec, YAML, ...)."""
        return self.strategy(
            spec.name, spec.event, spec.constraint, list(spec.actions), spec.cooldown_s, spec.max_per_minute
        )

    def declared_events(self) -> frozenset[str]:
        """Every event name this agent says it produces: its own `emits`, its sensors' and actuators'."""
        names = set(self.emits)
        for sensor in self.sensors.values():
            names.update(sensor.emits)
        for actuator in self.actuators.values():
            names.update(actuator.emits)
        return frozenset(names)

    def on_startup(self, fn: F) -> F:
        """Register `fn(ctx)` (sync or async) to run when the agent's app starts."""
        self.startup_hooks.append(fn)
        return fn

    def on_shutdown(self, fn: F) -> F:
        """Register `fn(ctx)` (sync or async) to run when the agent's app stops."""
        self.shutdown_hooks.append(fn)
        return fn

    def check(self) -> None:
        """Every local action names a registered actuator (called at startup, when all are known), and
        an agent that needs its workflow has one."""
        if self.needs_workflow and self.workflow is None:
            raise AgentDefinitionError(
                f"agent {self.name!r} needs the workflow it supervises: set SCANFLOW_WORKFLOW to the workflow "
                "file (scanflow agent run binds it), or serve agent.bound(workflow)"
            )
        for s in self.strategies.values():
            for a in s.actions:
                if a.agent in (None, self.name) and a.actuator not in self.actuators:
                    raise AgentDefinitionError(
                        f"strategy {s.name!r} uses actuator {a.actuator!r}, which agent {self.name!r} "
                        f"does not have (actuators: {sorted(self.actuators)})"
                    )
