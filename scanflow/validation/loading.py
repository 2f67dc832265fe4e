"""The checks of `scanflow validate` that need code: the workflow file, agent modules, job entry points.

Everything here imports user code and turns each failure (an exception of any kind, a SyntaxError, a
missing module) into one Problem, never a traceback. Agent modules are imported the way the embedded
stack's agent processes import them: with SCANFLOW_WORKFLOW naming the workflow being validated (the
reference agents read it at import time), each module executed afresh, and the process's environment
and imports restored afterwards, so that validating two workflows in one process gives two answers.
Who calls: scanflow.validation.validate_file / validate_workflow.
"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
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


@contextmanager
def workflow_in_env(wf: Workflow) -> Iterator[None]:
    """SCANFLOW_WORKFLOW names a temporary YAML copy of `wf` (and the cached workflow is forgotten)
    while the block runs; the previous value and cache come back after."""
    from scanflow.agentkit.env import WORKFLOW_ENV, current_workflow

    previous = os.environ.get(WORKFLOW_ENV)
    with tempfile.TemporaryDirectory(prefix="scanflow-validate-") as tmp:
        path = Path(tmp) / "workflow.yaml"
        path.write_text(wf.to_yaml())
        os.environ[WORKFLOW_ENV] = str(path)
        current_workflow.cache_clear()
        try:
            yield
        finally:
            if previous is None:
                os.environ.pop(WORKFLOW_ENV, None)
            else:
                os.environ[WORKFLOW_ENV] = previous
            current_workflow.cache_clear()


def import_fresh(name: str) -> ModuleType:
    """Execute module `name` anew (an earlier import read another workflow), then put back whatever
    sys.modules and the parent package held before: the caller keeps the new module object."""
    parent, _, leaf = name.rpartition(".")
    before = sys.modules.pop(name, None)
    parent_module = sys.modules.get(parent) if parent else None
    parent_attr = getattr(parent_module, leaf, None) if parent_module is not None else None
    try:
        return importlib.import_module(name)
    finally:
        if before is not None:
            sys.modules[name] = before
        else:
            sys.modules.pop(name, None)
        parent_module = sys.modules.get(parent) if parent else None
        if parent_module is not None:
            if parent_attr is not None:
                setattr(parent_module, leaf, parent_attr)
            elif hasattr(parent_module, leaf):
                delattr(parent_module, leaf)


class NotAnAgent(Exception):
    """`AgentSpec.module` does not lead to an Agent (bad form, no such attribute, another type)."""


def load_agent(module: str) -> Any:
    """The object `attr` of 'package.module:attr', imported afresh; NotAnAgent when it is none (what the
    module itself raises while importing passes through)."""
    from scanflow.agent import Agent

    module_name, _, attr = module.partition(":")
    if not module_name or not attr:
        raise NotAnAgent("must be 'package.module:attr', the module and the Agent object in it")
    obj = getattr(import_fresh(module_name), attr, None)
    if obj is None:
        raise NotAnAgent(f"module {module_name!r} has no attribute {attr!r}")
    if not isinstance(obj, Agent):
        raise NotAnAgent(f"{attr!r} is a {type(obj).__name__}, not a scanflow.agent.Agent")
    return obj


def load_agent_facts(wf: Workflow) -> tuple[dict[str, AgentFacts], list[Problem]]:
    """Import every agent's `module` under `wf`: the facts of those that import, a Problem for each
    that does not. Agents without a module are neither (a check that needs one says so)."""
    facts: dict[str, AgentFacts] = {}
    problems: list[Problem] = []
    with workflow_in_env(wf):
        for a in wf.agents:
            if a.module is None:
                continue
            try:
                facts[a.name] = AgentFacts.of(load_agent(a.module))
            except NotAnAgent as exc:
                problems.append(Problem(f"agents.{a.name}.module", a.module, str(exc)))
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - user code: report it
                problems.append(Problem(f"agents.{a.name}.module", a.module, f"cannot import: {describe(exc)}"))
    return facts, problems


def check_job_entrypoints(wf: Workflow) -> list[Problem]:
    """Each job's 'module:function' entry point imports and is callable (as the job runner loads it);
    command-list entry points are programs, not checked."""
    from scanflow.platform.jobrunner import load_entrypoint

    problems = []
    with workflow_in_env(wf):
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
