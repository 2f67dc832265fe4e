"""The meaning checks of `scanflow validate`: pure functions from a parsed workflow to a list of Problems.

A workflow can be well-formed (scanflow.spec accepts it) and still not run: a constraint that does
not compile, an action for an agent or actuator that does not exist, a strategy waiting for an event
nobody produces, a settings key no code reads, an executor with no training job. Each check here
returns one Problem per such mistake, naming the field path and its value. What is known only by
importing the agents' code arrives as `AgentFacts` (built by scanflow.validation.loading), so every
function here runs without processes, files or imports.
Who calls: scanflow.validation.validate_workflow (the CLI), and the tests.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scanflow.agent.agent import Agent, AgentDefinitionError, build_strategy
from scanflow.agent.engine import event_matches
from scanflow.spec import AgentSpec, Workflow

MAX_SHOWN = 80


@dataclass(frozen=True)
class Problem:
    """One mistake: the field path ('agents.planner.settings.retrain'), its value, and what is wrong.

    `show_value=False` for a problem of the file itself (it cannot be read), which has no field."""

    path: str
    value: Any
    message: str
    show_value: bool = True

    def line(self) -> str:
        """The one line the CLI prints: 'path = value: message' (newlines in messages folded)."""
        message = " ".join(self.message.split())
        if not self.show_value:
            return f"{self.path}: {message}"
        return f"{self.path} = {show_value(self.value)}: {message}"


def show_value(value: Any) -> str:
    """A value as JSON (strings in double quotes), cut to 80 characters."""
    try:
        shown = json.dumps(value, default=str, ensure_ascii=False)
    except ValueError:  # a circular structure: say what it is
        shown = repr(value)
    return shown if len(shown) <= MAX_SHOWN else shown[: MAX_SHOWN - 3] + "..."


@dataclass(frozen=True)
class AgentFacts:
    """What an agent's code declares, as the checks need it: the name its Agent object has, its
    actuators, the events it says it produces, and its settings keys (None: it does not say)."""

    name: str
    actuators: frozenset[str]
    events: frozenset[str]
    settings_keys: frozenset[str] | None

    @classmethod
    def of(cls, agent: Agent) -> AgentFacts:
        keys = None if agent.settings_keys is None else frozenset(agent.settings_keys)
        return cls(agent.name, frozenset(agent.actuators), agent.declared_events(), keys)


def _strategy_path(agent: AgentSpec, strategy: str) -> str:
    return f"agents.{agent.name}.strategies.{strategy}"


def check_constraints(wf: Workflow) -> list[Problem]:
    """Every strategy compiles, by the very check `POST /strategies` makes (build_strategy)."""
    problems = []
    for a in wf.agents:
        for s in a.strategies:
            try:
                build_strategy(s.name, s.event, s.constraint, list(s.actions), s.cooldown_s, s.max_per_minute)
            except AgentDefinitionError as exc:
                why = str(exc).removeprefix(f"strategy {s.name!r}: ")
                problems.append(Problem(f"{_strategy_path(a, s.name)}.constraint", s.constraint,
                                        f"invalid constraint: {why}"))
    return problems


def check_action_agents(wf: Workflow) -> list[Problem]:
    """An action's `agent` names an agent of this workflow (None: the strategy's own agent)."""
    names = [a.name for a in wf.agents]
    problems = []
    for a in wf.agents:
        for s in a.strategies:
            for i, act in enumerate(s.actions):
                if act.agent is not None and act.agent not in names:
                    problems.append(Problem(
                        f"{_strategy_path(a, s.name)}.actions.{i}.agent", act.agent,
                        f"no agent of workflow {wf.name!r} is named {act.agent!r} (agents: {names})"))
    return problems


def check_actuators(wf: Workflow, facts: Mapping[str, AgentFacts]) -> list[Problem]:
    """An action's actuator exists on the agent that runs it: this agent for a local action, the named
    one for a remote action. An agent whose module failed to import was reported already: skipped."""
    specs = {a.name: a for a in wf.agents}
    problems = []
    for a in wf.agents:
        for s in a.strategies:
            for i, act in enumerate(s.actions):
                runner = specs.get(act.agent or a.name)
                if runner is None:  # an unknown agent: check_action_agents says so
                    continue
                path = f"{_strategy_path(a, s.name)}.actions.{i}.actuator"
                known = facts.get(runner.name)
                if known is not None:
                    if act.actuator not in known.actuators:
                        problems.append(Problem(path, act.actuator, (
                            f"agent {runner.name!r} ({runner.module}) has no actuator {act.actuator!r} "
                            f"(has {sorted(known.actuators)})")))
                elif runner.module is None:
                    problems.append(Problem(path, act.actuator, (
                        f"cannot check that agent {runner.name!r} has this actuator: it declares no module "
                        "(set agents.<name>.module to 'package.module:agent')")))
    return problems


def check_agent_names(wf: Workflow, facts: Mapping[str, AgentFacts]) -> list[Problem]:
    """The Agent object a module builds carries the workflow's name for it (peers address it so)."""
    return [
        Problem(f"agents.{a.name}.module", a.module,
                f"builds an agent named {facts[a.name].name!r}, but the workflow calls it {a.name!r}")
        for a in wf.agents
        if a.name in facts and facts[a.name].name != a.name
    ]


def check_events(wf: Workflow, facts: Mapping[str, AgentFacts]) -> list[Problem]:
    """A strategy's event (exact or glob, matched as the engine matches) is one some agent of the
    workflow declares it produces. Enforced only when the code of every agent is known: an agent
    without a module, or whose module did not import, may produce anything."""
    if any(a.name not in facts for a in wf.agents):
        return []
    produced = sorted(set().union(*(f.events for f in facts.values())))
    problems = []
    for a in wf.agents:
        for s in a.strategies:
            if not any(event_matches(name, s.event) for name in produced):
                problems.append(Problem(f"{_strategy_path(a, s.name)}.event", s.event, (
                    f"no agent of workflow {wf.name!r} declares an event this matches, so the strategy "
                    f"never fires (declared: {produced})")))
    return problems


def check_settings(wf: Workflow, facts: Mapping[str, AgentFacts]) -> list[Problem]:
    """Every key of an agent's `settings` is one its code declares it reads (`settings_keys`); agents
    that do not declare theirs, or whose code is unknown, are not checked."""
    problems = []
    for a in wf.agents:
        known = facts.get(a.name)
        if known is None or known.settings_keys is None:
            continue
        for key, value in a.settings.items():
            if key not in known.settings_keys:
                problems.append(Problem(f"agents.{a.name}.settings.{key}", value, (
                    f"unknown settings key {key!r}: agent {a.name!r} ({a.module}) reads "
                    f"{sorted(known.settings_keys)}")))
    return problems


def check_jobs(wf: Workflow) -> list[Problem]:
    """The Executor runs the workflow's first job as its training job: services supervised by an
    executor need one."""
    executors = [a.name for a in wf.agents if a.role == "executor"]
    if wf.services and executors and not wf.jobs:
        return [Problem("jobs", [], (
            f"agent {executors[0]!r} (role executor) retrains the services by running the workflow's "
            "first job, and there is none: declare the training job"))]
    return []
