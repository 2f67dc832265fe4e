"""`scanflow validate`: a workflow's meaning, not only its shape; one Problem per mistake.

`validate_file(path)` reads the file (scanflow.spec) and, when its shape is right, runs
`validate_workflow`: the pure checks of scanflow.validation.checks, fed with what importing the agents'
modules and the jobs' entry points tells (scanflow.validation.loading). The CLI only prints
`Problem.line()` for each and exits 2 when there is any.
Who calls: scanflow.cli (`validate`), tests.
"""

from __future__ import annotations

from pathlib import Path

from scanflow.spec import Workflow
from scanflow.validation.checks import (
    AgentFacts,
    Problem,
    check_action_agents,
    check_actuators,
    check_agent_names,
    check_constraints,
    check_events,
    check_jobs,
    check_settings,
)
from scanflow.validation.loading import check_job_entrypoints, load_agent_facts, read_workflow

__all__ = ["AgentFacts", "Problem", "validate_file", "validate_workflow"]


def _without_bad_strategies(wf: Workflow, bad: set[tuple[str, str]]) -> Workflow:
    """`wf` less the strategies whose constraint does not compile: the reference agents register the
    workflow's strategies at import, and one already reported must not fail the import as well."""
    if not bad:
        return wf
    agents = [
        a.model_copy(update={"strategies": [s for s in a.strategies if (a.name, s.name) not in bad]})
        for a in wf.agents
    ]
    return wf.model_copy(update={"agents": agents})


def validate_workflow(wf: Workflow) -> list[Problem]:
    """Every meaning problem of a well-formed workflow, in the order of the checks."""
    problems = check_constraints(wf)
    failed = {p.path for p in problems}
    bad = {(a.name, s.name) for a in wf.agents for s in a.strategies
           if f"agents.{a.name}.strategies.{s.name}.constraint" in failed}
    problems += check_action_agents(wf)
    problems += check_jobs(wf)
    facts, import_problems = load_agent_facts(_without_bad_strategies(wf, bad))
    problems += import_problems
    problems += check_job_entrypoints(wf)
    problems += check_agent_names(wf, facts)
    problems += check_actuators(wf, facts)
    problems += check_settings(wf, facts)
    problems += check_events(wf, facts)
    return problems


def validate_file(path: str | Path) -> tuple[Workflow | None, list[Problem]]:
    """(the workflow, its problems): the workflow is None when the file could not be read as one."""
    wf, problems = read_workflow(Path(path))
    if wf is None:
        return None, problems
    return wf, validate_workflow(wf)
