"""`scanflow validate` checks meaning: each broken workflow gives exactly one line naming the field and the
value, exit code 2; the digits workflow passes; a Python file that cannot run gives one line, no traceback.
The pure checks of scanflow.validation.checks are tested on values, without imports or processes."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from scanflow.agent import Agent
from scanflow.agent.agent import AgentDefinitionError
from scanflow.agent.engine import event_matches
from scanflow.cli import app
from scanflow.spec import ActionSpec, AgentSpec, Job, Service, StrategySpec, Workflow
from scanflow.validation import validate_workflow
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
    show_value,
)
from scanflow.validation.loading import describe

ROOT = Path(__file__).resolve().parents[2]
DIGITS_YAML = ROOT / "workflows" / "digits" / "workflow.yaml"


def digits() -> dict[str, Any]:
    """The digits workflow as a plain dict, to break one field at a time."""
    data: dict[str, Any] = yaml.safe_load(DIGITS_YAML.read_text())
    return data


def agent_of(data: dict[str, Any], name: str) -> dict[str, Any]:
    return next(a for a in data["agents"] if a["name"] == name)


def strategy_of(data: dict[str, Any], agent: str, name: str) -> dict[str, Any]:
    return next(s for s in agent_of(data, agent)["strategies"] if s["name"] == name)


def run_cli(path: Path) -> tuple[int, list[str]]:
    """(exit code, stderr lines) of `scanflow validate PATH`, in this process."""
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stderr.splitlines()


def broken(tmp_path: Path, change: Callable[[dict[str, Any]], None]) -> tuple[int, list[str]]:
    data = digits()
    change(data)
    path = tmp_path / "wf.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return run_cli(path)


def assert_one_line(rc: int, lines: list[str], starts: str, *contains: str) -> None:
    assert rc == 2, lines
    assert len(lines) == 1, lines
    assert lines[0].startswith(starts), lines[0]
    for text in contains:
        assert text in lines[0], lines[0]


# -- the digits workflow passes, in both forms ---------------------------------------------------
@pytest.mark.parametrize("name", ["workflow.py", "workflow.yaml"])
def test_digits_workflow_validates(name: str) -> None:
    result = CliRunner().invoke(app, ["validate", "--yaml", str(ROOT / "workflows" / "digits" / name)])
    assert result.exit_code == 0, result.stderr
    assert Workflow.from_yaml(result.stdout).name == "digits"
    assert "ok: workflow 'digits'" in result.stderr


def test_two_workflows_validate_in_one_process_without_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agents' modules read no workflow when imported: each validation binds them to its own."""
    monkeypatch.delenv("SCANFLOW_WORKFLOW", raising=False)
    digits_wf = Workflow.from_yaml(DIGITS_YAML.read_text())
    renamed = digits_wf.model_copy(update={"name": "digits-b", "agents": [
        a.model_copy(update={"settings": {**a.settings, "retrian": {}}}) if a.role == "planner" else a
        for a in digits_wf.agents]})
    assert validate_workflow(digits_wf) == []
    assert [p.path for p in validate_workflow(renamed)] == ["agents.planner.settings.retrian"]
    assert validate_workflow(digits_wf) == []  # nothing of the second stuck to the modules
    assert "SCANFLOW_WORKFLOW" not in os.environ


# -- one line per broken case, through the CLI ----------------------------------------------------
def test_invalid_constraint(tmp_path: Path) -> None:
    def change(d: dict[str, Any]) -> None:
        strategy_of(d, "planner", "retrain-on-drift")["constraint"] = "since('x') >"

    rc, lines = broken(tmp_path, change)
    assert_one_line(rc, lines, """agents.planner.strategies.retrain-on-drift.constraint = "since('x') >": """,
                    "invalid constraint", "not a valid expression")


def test_constraint_calling_a_forbidden_function(tmp_path: Path) -> None:
    def change(d: dict[str, Any]) -> None:
        strategy_of(d, "executor", "execute-scale")["constraint"] = "__import__('os')"

    rc, lines = broken(tmp_path, change)
    assert_one_line(rc, lines, "agents.executor.strategies.execute-scale.constraint = ", "invalid constraint")


def test_action_for_an_unknown_agent(tmp_path: Path) -> None:
    def change(d: dict[str, Any]) -> None:
        strategy_of(d, "tracker", "check-drift")["actions"][0]["agent"] = "chekcer"

    rc, lines = broken(tmp_path, change)
    assert_one_line(rc, lines, 'agents.tracker.strategies.check-drift.actions.0.agent = "chekcer": ',
                    "no agent of workflow 'digits' is named 'chekcer'")


def test_local_actuator_the_agent_lacks(tmp_path: Path) -> None:
    def change(d: dict[str, Any]) -> None:
        strategy_of(d, "planner", "assess-drift")["actions"][0]["actuator"] = "plan_retrian"

    rc, lines = broken(tmp_path, change)
    assert_one_line(rc, lines, 'agents.planner.strategies.assess-drift.actions.0.actuator = "plan_retrian": ',
                    "agent 'planner'", "has no actuator 'plan_retrian'", "plan_retrain")


def test_remote_actuator_the_named_agent_lacks(tmp_path: Path) -> None:
    def change(d: dict[str, Any]) -> None:
        strategy_of(d, "tracker", "check-drift")["actions"][0]["actuator"] = "check_drfit"

    rc, lines = broken(tmp_path, change)
    assert_one_line(rc, lines, 'agents.tracker.strategies.check-drift.actions.0.actuator = "check_drfit": ',
                    "agent 'checker'", "has no actuator 'check_drfit'")


def test_action_on_an_agent_without_module_says_so(tmp_path: Path) -> None:
    def change(d: dict[str, Any]) -> None:
        d["agents"].append({"name": "notifier", "role": "custom"})
        strategy_of(d, "planner", "failover")["actions"].append({"actuator": "page", "agent": "notifier"})

    rc, lines = broken(tmp_path, change)
    assert_one_line(rc, lines, 'agents.planner.strategies.failover.actions.1.actuator = "page": ',
                    "agent 'notifier'", "declares no module")


def test_agent_module_that_does_not_import(tmp_path: Path) -> None:
    def change(d: dict[str, Any]) -> None:
        agent_of(d, "checker")["module"] = "agents.nope:agent"

    rc, lines = broken(tmp_path, change)
    assert_one_line(rc, lines, 'agents.checker.module = "agents.nope:agent": ',
                    "cannot import", "ModuleNotFoundError")


def test_agent_module_attribute_that_is_not_an_agent(tmp_path: Path) -> None:
    def change(d: dict[str, Any]) -> None:
        agent_of(d, "checker")["module"] = "scanflow.standard.checker:MIN_ROWS"

    rc, lines = broken(tmp_path, change)
    assert_one_line(rc, lines, 'agents.checker.module = "scanflow.standard.checker:MIN_ROWS": ',
                    "is a int, not a scanflow.agent.Agent")


def test_job_entrypoint_that_is_not_there(tmp_path: Path) -> None:
    def change(d: dict[str, Any]) -> None:
        d["jobs"][0]["entrypoint"] = "scanflow.examples.digits.train:trian"

    rc, lines = broken(tmp_path, change)
    assert_one_line(rc, lines, 'jobs.train.entrypoint = "scanflow.examples.digits.train:trian": ', "no function 'trian'")


def test_job_entrypoint_module_missing(tmp_path: Path) -> None:
    def change(d: dict[str, Any]) -> None:
        d["jobs"][0]["entrypoint"] = "nowhere.train:train"

    rc, lines = broken(tmp_path, change)
    assert_one_line(rc, lines, 'jobs.train.entrypoint = "nowhere.train:train": ',
                    "cannot import", "ModuleNotFoundError")


def test_strategy_event_nobody_produces(tmp_path: Path) -> None:
    def change(d: dict[str, Any]) -> None:
        strategy_of(d, "planner", "retrain-on-drift")["event"] = "drift.detcted"

    rc, lines = broken(tmp_path, change)
    assert_one_line(rc, lines, 'agents.planner.strategies.retrain-on-drift.event = "drift.detcted": ',
                    "no agent of workflow 'digits' declares an event", "drift.detected")


def test_event_glob_matching_a_declared_event_passes(tmp_path: Path) -> None:
    def change(d: dict[str, Any]) -> None:
        strategy_of(d, "planner", "assess-drift")["event"] = "drift.check*"

    rc, lines = broken(tmp_path, change)
    assert rc == 0, lines


def test_unknown_settings_key(tmp_path: Path) -> None:
    def change(d: dict[str, Any]) -> None:
        agent_of(d, "planner")["settings"]["retrian"] = {"k": 2}

    rc, lines = broken(tmp_path, change)
    assert_one_line(rc, lines, 'agents.planner.settings.retrian = {"k": 2}: ', "unknown settings key 'retrian'")


def test_executor_and_services_without_a_job(tmp_path: Path) -> None:
    def change(d: dict[str, Any]) -> None:
        d["jobs"] = []

    rc, lines = broken(tmp_path, change)
    assert_one_line(rc, lines, "jobs = []: ", "agent 'executor'", "first job")


def test_shape_errors_are_one_line_each(tmp_path: Path) -> None:
    def change(d: dict[str, Any]) -> None:
        d["services"][0]["replicas"] = -1
        d["services"][1]["max_batch_size"] = 0

    rc, lines = broken(tmp_path, change)
    assert rc == 2
    assert [line.split(" = ")[0] for line in lines] == ["services.0.replicas", "services.1.max_batch_size"]


# -- a Python workflow that cannot run: one line, no traceback (a real process) ------------------
@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from scanflow.spec import Workflow\nworkflow = Workflow(name='x'\n", "SyntaxError"),
        ("import no_such_module_here\nworkflow = None\n", "ModuleNotFoundError: No module named"),
        ("x = 1\nraise RuntimeError('boom')\n", "RuntimeError: boom (line 2)"),
    ],
    ids=["syntax-error", "missing-module", "raises"],
)
def test_python_file_that_cannot_run(tmp_path: Path, source: str, expected: str) -> None:
    path = tmp_path / "broken_wf.py"
    path.write_text(source)
    out = subprocess.run([sys.executable, "-m", "scanflow.cli", "validate", str(path)],
                         capture_output=True, text=True, check=False, cwd=ROOT)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    lines = out.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{path}: cannot run the workflow file: "), lines[0]
    assert expected in lines[0]


def test_missing_file_is_one_line(tmp_path: Path) -> None:
    rc, lines = run_cli(tmp_path / "nope.yaml")
    assert_one_line(rc, lines, str(tmp_path / "nope.yaml"), "does not exist")


# -- the pure checks, on values ------------------------------------------------------------------
def facts(name: str, actuators: tuple[str, ...] = (), events: tuple[str, ...] = (),
          settings_keys: tuple[str, ...] | None = None) -> AgentFacts:
    return AgentFacts(name, frozenset(actuators), frozenset(events),
                      None if settings_keys is None else frozenset(settings_keys))


def wf_with(*agents: AgentSpec, jobs: tuple[Job, ...] = (), services: tuple[Service, ...] = ()) -> Workflow:
    return Workflow(name="w", agents=list(agents), jobs=list(jobs), services=list(services))


def strategy(event: str = "a.b", actuator: str = "act", agent: str | None = None,
             constraint: str = "True", name: str = "s") -> StrategySpec:
    return StrategySpec(name=name, event=event, constraint=constraint,
                        actions=[ActionSpec(actuator=actuator, agent=agent)])


def test_problem_line_and_value_shown() -> None:
    assert Problem("a.b", "x", "bad\n  thing").line() == 'a.b = "x": bad thing'
    assert Problem("f.py", None, "gone", show_value=False).line() == "f.py: gone"
    assert show_value(None) == "null"
    assert len(show_value("y" * 500)) == 80


def test_check_constraints_uses_the_rest_check() -> None:
    wf = wf_with(AgentSpec(name="a", strategies=[strategy(constraint="event.x >"),
                                                   strategy(name="ok", constraint="event.x > 1")]))
    problems = check_constraints(wf)
    assert [p.path for p in problems] == ["agents.a.strategies.s.constraint"]
    assert problems[0].message.startswith("invalid constraint: ")
    assert "strategy 's'" not in problems[0].message


def test_check_action_agents() -> None:
    wf = wf_with(AgentSpec(name="a", strategies=[strategy(agent="b"), strategy(name="t", agent="zz")]),
                 AgentSpec(name="b"))
    assert [(p.path, p.value) for p in check_action_agents(wf)] == [("agents.a.strategies.t.actions.0.agent", "zz")]


def test_check_actuators_local_remote_and_unknown_code() -> None:
    wf = wf_with(
        AgentSpec(name="a", module="m:a", strategies=[strategy(actuator="mine"), strategy(name="r", actuator="x",
                                                                                           agent="b")]),
        AgentSpec(name="b", module="m:b"),
        AgentSpec(name="c", strategies=[strategy(actuator="y")]),  # no module
    )
    known = {"a": facts("a", ("mine",)), "b": facts("b", ("other",))}
    problems = check_actuators(wf, known)
    assert [(p.path, p.value) for p in problems] == [
        ("agents.a.strategies.r.actions.0.actuator", "x"),
        ("agents.c.strategies.s.actions.0.actuator", "y"),
    ]
    assert "declares no module" in problems[1].message
    # b's module failed to import (reported elsewhere): its actions are not judged again
    assert [p.path for p in check_actuators(wf, {"a": facts("a", ("mine",))})] == [
        "agents.c.strategies.s.actions.0.actuator"]


def test_check_events_glob_and_enforced_only_with_all_code_known() -> None:
    wf = wf_with(AgentSpec(name="a", module="m:a", strategies=[strategy(event="drift.*"),
                                                                strategy(name="t", event="plan.done")]),
                 AgentSpec(name="b", module="m:b"))
    known = {"a": facts("a", events=("drift.checked",)), "b": facts("b")}
    assert [p.path for p in check_events(wf, known)] == ["agents.a.strategies.t.event"]
    assert check_events(wf, {"a": known["a"]}) == []  # b's code unknown: it may produce plan.done
    known["b"] = facts("b", events=("plan.done",))
    assert check_events(wf, known) == []


def test_check_settings() -> None:
    wf = wf_with(AgentSpec(name="a", module="m:a", settings={"k": 1, "typo": 2}),
                 AgentSpec(name="b", module="m:b", settings={"anything": 1}))
    problems = check_settings(wf, {"a": facts("a", settings_keys=("k",)), "b": facts("b")})
    assert [(p.path, p.value) for p in problems] == [("agents.a.settings.typo", 2)]


def test_check_agent_names() -> None:
    wf = wf_with(AgentSpec(name="a", module="m:a"))
    assert check_agent_names(wf, {"a": facts("a")}) == []
    assert [p.path for p in check_agent_names(wf, {"a": facts("other")})] == ["agents.a.module"]


def test_check_jobs() -> None:
    svc = Service(name="s", model_uri="models:/m@champion")
    executor = AgentSpec(name="e", role="executor")
    assert [p.path for p in check_jobs(wf_with(executor, services=(svc,)))] == ["jobs"]
    assert check_jobs(wf_with(executor, services=(svc,), jobs=(Job(name="t", entrypoint="m:f"),))) == []
    assert check_jobs(wf_with(AgentSpec(name="p", role="planner"), services=(svc,))) == []
    assert check_jobs(wf_with(executor)) == []


def test_describe_names_the_line_in_the_file(tmp_path: Path) -> None:
    file = tmp_path / "f.py"
    file.write_text("x = 1\nraise KeyError('k')\n")
    with pytest.raises(KeyError) as info:
        runpy.run_path(str(file))
    assert describe(info.value, file) == "KeyError: 'k' (line 2)"
    assert describe(ValueError()) == "ValueError"


# -- the SDK's declarations ----------------------------------------------------------------------
def test_emits_and_settings_keys_are_declared_on_the_specs() -> None:
    agent = Agent("x", emits=("route.hit",), settings_keys=("k",))

    @agent.sensor(every=1.0, emits=("s.ev",))
    def sense(ctx: Any) -> None:
        return None

    @agent.actuator("act", emits=("a.ev",))
    def act(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
        return {}

    assert agent.sensors["sense"].emits == ("s.ev",)
    assert agent.actuators["act"].emits == ("a.ev",)
    assert agent.declared_events() == {"route.hit", "s.ev", "a.ev"}
    assert agent.settings_keys == ("k",)
    assert Agent("y").settings_keys is None


@pytest.mark.parametrize("bad", ["drift.checked", ("drift.*",), ("",)])
def test_emits_refuses_a_string_a_pattern_or_an_empty_name(bad: Any) -> None:
    with pytest.raises(AgentDefinitionError):
        Agent("x", emits=bad)
    with pytest.raises(AgentDefinitionError):
        Agent("x").actuator("a", emits=bad)


def test_event_matches_is_the_engines_rule() -> None:
    assert event_matches("drift.checked", "drift.*")
    assert event_matches("drift.checked", "drift.checked")
    assert not event_matches("drift.checked", "drift.detected")
    assert event_matches("anything", "*")
