"""An agent learns its workflow at start, not at import (Agent.bound, ctx.workflow / ctx.spec / ctx.resources).

The reference agents are imported with no SCANFLOW_WORKFLOW, bound to two workflows in one process and
served side by side; `scanflow agent run` binds from SCANFLOW_WORKFLOW / --workflow and refuses, exit 2
with the variable named, an agent that needs a workflow and has none.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from agent_support import TOKEN, running
from fastapi import APIRouter
from typer.testing import CliRunner

from scanflow.agent import Agent, AgentDefinitionError, Context, Store
from scanflow.cli import app as cli
from scanflow.settings import Settings
from scanflow.spec import ActionSpec, AgentSpec, StrategySpec, Workflow, load_workflow

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "workflows" / "digits" / "workflow.yaml"
SENSORS = ROOT / "workflows" / "sensors" / "workflow.yaml"


def _workflow(name: str, *agents: AgentSpec) -> Workflow:
    return Workflow(name=name, agents=list(agents))


def _counter() -> Agent:
    """A custom agent whose actuator, hook and route read only what it was bound to."""
    agent = Agent("counter", needs_workflow=True)

    @agent.actuator("describe")
    def describe(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
        return {"workflow": ctx.workflow.name, "step": ctx.spec.settings.get("step"), "opened": ctx.resources["opened"]}

    @agent.on_startup
    def open_things(ctx: Context) -> None:
        ctx.resources["opened"] = f"{ctx.workflow.name}-log"

    @agent.routes
    def routes(settings: Settings, resources: dict[str, Any]) -> APIRouter:
        router = APIRouter()

        @router.get("/opened")
        def opened() -> dict[str, Any]:
            return {"opened": resources.get("opened"), "has_token": settings.token is not None}

        return router

    return agent


def _spec(name: str, step: int, *strategies: StrategySpec) -> AgentSpec:
    return AgentSpec(name=name, role="custom", settings={"step": step}, strategies=list(strategies))


def test_bound_copies_carry_their_workflow_and_leave_the_original_alone() -> None:
    agent = _counter()
    tick = StrategySpec(name="tick", event="clock.tick", actions=[ActionSpec(actuator="describe")])
    a = agent.bound(_workflow("wf-a", _spec("counter", 1, tick)))
    b = agent.bound(_workflow("wf-b", _spec("counter", 2)))
    assert (a.workflow.name, b.workflow.name) == ("wf-a", "wf-b")  # type: ignore[union-attr]
    assert sorted(a.strategies) == ["tick"] and b.strategies == {} and agent.strategies == {}
    assert agent.workflow is None and agent.spec is None
    again = a.bound(_workflow("wf-c", _spec("counter", 3)))  # re-bound: wf-a's strategies give way
    assert again.strategies == {} and again.spec is not None and again.spec.settings["step"] == 3
    with pytest.raises(AgentDefinitionError, match="SCANFLOW_WORKFLOW"):
        agent.check()  # needs_workflow: refused unbound, before anything starts
    a.check()


def test_binding_finds_the_spec_by_name_then_by_role() -> None:
    from scanflow.standard.checker import agent as checker

    wf = load_workflow(DIGITS)
    renamed = wf.model_copy(update={"agents": [a.model_copy(update={"name": "drift-watch"}) if a.role == "checker"
                                               else a for a in wf.agents]})
    bound = checker.bound(renamed)
    assert bound.name == "drift-watch" and bound.spec is not None and bound.spec.role == "checker"
    assert checker.name == "checker"
    with pytest.raises(AgentDefinitionError, match="declares no agent named 'counter'"):
        _counter().bound(wf)
    two = wf.model_copy(update={"agents": [*wf.agents, next(a for a in wf.agents if a.role == "checker")
                                           .model_copy(update={"name": "checker-b"})]})
    renamed_two = two.model_copy(update={"agents": [a.model_copy(update={"name": "c-" + a.name})
                                                    if a.role == "checker" else a for a in two.agents]})
    with pytest.raises(AgentDefinitionError, match="several"):
        checker.bound(renamed_two)


def test_a_strategy_clashing_with_the_codes_is_refused() -> None:
    agent = _counter()
    agent.strategy("tick", event="clock.tick", actions=[ActionSpec(actuator="describe")])
    clash = StrategySpec(name="tick", event="other", actions=[ActionSpec(actuator="describe")])
    with pytest.raises(AgentDefinitionError, match="already registered"):
        agent.bound(_workflow("wf", _spec("counter", 1, clash)))


async def test_two_workflows_served_side_by_side_in_one_process(tmp_path: Path) -> None:
    agent = _counter()
    seen = {}
    for name, step in (("wf-a", 1), ("wf-b", 2)):
        bound = agent.bound(_workflow(name, _spec("counter", step)))
        store = Store(f"sqlite:///{tmp_path / (name + '.db')}")
        try:
            async with running(bound, store, settings=Settings(token=TOKEN, home=tmp_path / name)) as client:
                r = await client.post("/actuators/describe", json={"args": {}})
                assert r.status_code == 200, r.text
                seen[name] = r.json()["result"]
                opened = (await client.get("/opened")).json()
                assert opened == {"opened": f"{name}-log", "has_token": True}  # the app's own settings
        finally:
            store.close()
    assert seen == {"wf-a": {"workflow": "wf-a", "step": 1, "opened": "wf-a-log"},
                    "wf-b": {"workflow": "wf-b", "step": 2, "opened": "wf-b-log"}}


async def test_an_unbound_agent_says_what_it_lacks(tmp_path: Path) -> None:
    agent = Agent("plain")

    @agent.actuator("where")
    def where(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
        try:
            return {"workflow": ctx.workflow.name}
        except LookupError as exc:
            return {"error": str(exc)}

    store = Store(f"sqlite:///{tmp_path / 'plain.db'}")
    try:
        async with running(agent, store) as client:
            r = await client.post("/actuators/where", json={"args": {}})
            assert "started without a workflow" in r.json()["result"]["error"]
    finally:
        store.close()


def test_the_reference_agents_import_without_a_workflow() -> None:
    """Importing them reads nothing (a fresh interpreter, SCANFLOW_WORKFLOW unset); each binds to both
    shipped workflows in that one process, with the strategies each declares (plus the code's own)."""
    code = (
        "from scanflow.spec import load_workflow\n"
        "from scanflow.standard import checker, executor, planner, tracker\n"
        f"wfs = [load_workflow({str(DIGITS)!r}), load_workflow({str(SENSORS)!r})]\n"
        # the code's own strategies: infrastructure no workflow decides (the Executor rolls an image upgrade)
        "own = {executor: ['execute-upgrade']}\n"
        "for mod in (tracker, checker, planner, executor):\n"
        "    assert mod.agent.workflow is None and sorted(mod.agent.strategies) == own.get(mod, []), mod\n"
        "    for wf in wfs:\n"
        "        b = mod.agent.bound(wf)\n"
        "        b.check()\n"
        "        want = sorted([s.name for s in b.spec.strategies] + own.get(mod, []))\n"
        "        assert sorted(b.strategies) == want, (mod, wf.name)\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "SCANFLOW_WORKFLOW"}
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_agent_run_needs_the_workflow_of_an_agent_that_needs_one(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SCANFLOW_WORKFLOW", raising=False)
    runner = CliRunner()
    missing = runner.invoke(cli, ["agent", "run", "scanflow.standard.planner:agent"])
    assert missing.exit_code == 2 and "SCANFLOW_WORKFLOW" in missing.stderr, missing.stderr
    no_planner = tmp_path / "wf.yaml"
    no_planner.write_text(_workflow("lonely", _spec("counter", 1)).to_yaml())
    wrong = runner.invoke(cli, ["agent", "run", "scanflow.standard.planner:agent", "--workflow", str(no_planner)])
    assert wrong.exit_code == 2 and "declares no agent named 'planner' or with role 'planner'" in wrong.stderr
    monkeypatch.setenv("SCANFLOW_WORKFLOW", str(tmp_path / "absent.yaml"))
    absent = runner.invoke(cli, ["agent", "run", "scanflow.standard.planner:agent"])
    assert absent.exit_code == 2 and "absent.yaml" in absent.stderr, absent.stderr
