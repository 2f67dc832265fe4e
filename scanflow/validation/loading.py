"""The checks of `scanflow validate` that need code: the workflow file, agent modules, job entry points.

Everything here imports user code and turns each failure (an exception of any kind, a SyntaxError, a
missing module) into one Problem, never a traceback. An agent module is imported once and its Agent
bound to the workflow being validated (Agent.bound), the way `scanflow agent run` binds it at start:
nothing is read from the environment, so validating two workflows in one process gives two answers.
Who calls: scanflow.validation.validate_file / validate_workflow.
"""

from __future__ import annotations

import importlib
import traceback
from pathlib import Path
from typing import Any

from scanflow.spec import SpecError, Workflow, load_workflow
from scanflow.validation.checks import AgentFacts, Problem


def describe(exc: BaseException, file: Path | None = None) -> str:
    """'ModuleNotFoundError: No module named 'x' (line 3)': the exception on one line, with the line of
    `file` it was raised from when that file is in the traceback."""
    where = ""
    if file is not None and not isinstance(exc, SyntaxError):  # a SyntaxError names its line itself
        lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename) == file]
        if lines:
            where = f" (line {lines[-1]})"
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}{where}" if text else f"{type(exc).__name__}{where}"


def read_workflow(path: Path) -> tuple[Workflow | None, list[Problem]]:
    """The workflow of a .py/.yaml/.json file, or the problems that stop reading it: one per field for
    a shape error, one for the file otherwise (not found, bad YAML, the Python file raised)."""
    try:
        return load_workflow(path), []
    except SpecError as exc:
        if exc.items:
            return None, [Problem(loc, value, msg) for loc, value, msg in exc.items]
        return None, [Problem(str(path), None, str(exc), show_value=False)]
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - user code: report it, never a traceback
        return None, [Problem(str(path), None, f"cannot run the workflow file: {describe(exc, path.resolve())}",
                              show_value=False)]


class NotAnAgent(Exception):
    """`AgentSpec.module` does not lead to an Agent (bad form, no such attribute, another type)."""


def load_agent(module: str) -> Any:
    """The object `attr` of 'package.module:attr'; NotAnAgent when it is none (what the module itself
    raises while importing passes through)."""
    from scanflow.agent import Agent

    module_name, _, attr = module.partition(":")
    if not module_name or not attr:
        raise NotAnAgent("must be 'package.module:attr', the module and the Agent object in it")
    obj = getattr(importlib.import_module(module_name), attr, None)
    if obj is None:
        raise NotAnAgent(f"module {module_name!r} has no attribute {attr!r}")
    if not isinstance(obj, Agent):
        raise NotAnAgent(f"{attr!r} is a {type(obj).__name__}, not a scanflow.agent.Agent")
    return obj


def load_agent_facts(wf: Workflow) -> tuple[dict[str, AgentFacts], list[Problem]]:
    """Import every agent's `module` and bind its Agent to `wf` as `scanflow agent run` does: the facts
    of those that import, a Problem for each that does not. Agents without a module are neither (a check
    that needs one says so). An agent that cannot be bound (the workflow declares no agent of its name
    or role) keeps its code's name, which check_agent_names then reports."""
    from scanflow.agent import AgentDefinitionError

    facts: dict[str, AgentFacts] = {}
    problems: list[Problem] = []
    for a in wf.agents:
        if a.module is None:
            continue
        try:
            agent = load_agent(a.module)
        except NotAnAgent as exc:
            problems.append(Problem(f"agents.{a.name}.module", a.module, str(exc)))
            continue
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - user code: report it
            problems.append(Problem(f"agents.{a.name}.module", a.module, f"cannot import: {describe(exc)}"))
            continue
        if agent.name == a.name or (agent.role != "custom" and agent.role == a.role):  # as bound() finds it
            try:
                agent = agent.bound(wf, a)
            except AgentDefinitionError as exc:  # a declared strategy clashes with one of the code's
                problems.append(Problem(f"agents.{a.name}.strategies", None, str(exc), show_value=False))
        facts[a.name] = AgentFacts.of(agent)
    return facts, problems


def check_job_entrypoints(wf: Workflow) -> list[Problem]:
    """Each job's 'module:function' entry point imports and is callable (as the job runner loads it);
    command-list entry points are programs, not checked."""
    from scanflow.platform.jobrunner import load_entrypoint

    problems = []
    for job in wf.jobs:
        if not isinstance(job.entrypoint, str):
            continue
        try:
            load_entrypoint(job.entrypoint)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - user code: report it
            prefix = f"{job.entrypoint!r}: "  # load_entrypoint's own 'not callable' message
            own = isinstance(exc, TypeError) and str(exc).startswith(prefix)
            why = str(exc).removeprefix(prefix) if own else f"cannot import: {describe(exc)}"
            problems.append(Problem(f"jobs.{job.name}.entrypoint", job.entrypoint, why))
    return problems
