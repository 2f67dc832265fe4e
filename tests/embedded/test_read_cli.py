"""The command line's habits (--version, -h, `init PATH`, `validate --quiet/--yaml`), finding the one
stack here when no --home is given, and the pure parts of `scanflow decisions | plans | logs`. Their
reads against a running stack are in tests/e2e/test_cli_up.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from scanflow.cli import app
from scanflow.embedded.findstack import FoundStack, NoStackHere, choose, find_home, stacks_under
from scanflow.embedded.readcli import decision_line, decision_rows, log_names, plan_line, tail
from scanflow.embedded.statefile import Pid, StackState, write_state

REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "workflows" / "digits" / "workflow.py"


def stack_in(root: Path, name: str, alive: bool) -> Path:
    """A stack.json under root/.scanflow/name whose `up` is this test process (alive) or a pid with
    another start time (a stopped `up`)."""
    home = root / ".scanflow" / name
    home.mkdir(parents=True)
    me = Pid.of(os.getpid())
    pid = me if alive else Pid(me.pid, (me.started or 0) + 1)
    write_state(home, StackState(pid=pid, workflow=name, home=str(home), log_dir=str(home / "logs"),
                                 token_file=str(home / "token"),
                                 urls={"agents": {"planner": "http://127.0.0.1:1"}}))
    return home.resolve()


def found(name: str, alive: bool) -> FoundStack:
    state = StackState(pid=Pid(1), workflow=name, home=name, log_dir="", token_file="")
    return FoundStack(Path("/x") / name, state, alive)


# -- which stack, without --home ------------------------------------------------------------------------
def test_choose_takes_the_only_live_stack_else_the_only_one() -> None:
    assert choose([found("a", True)], Path(".")).home.name == "a"
    assert choose([found("a", True), found("b", False)], Path(".")).home.name == "a"  # a stale one beside
    assert choose([found("b", False)], Path(".")).home.name == "b"  # stale alone: down sweeps it


@pytest.mark.parametrize("stacks", [[], [found("a", True), found("b", True)], [found("a", False), found("b", False)]])
def test_choose_never_guesses(stacks: list[FoundStack]) -> None:
    with pytest.raises(NoStackHere, match="--home DIR or --workflow-name NAME") as err:
        choose(stacks, Path("."))
    for f in stacks:
        assert f.state.workflow in str(err.value)  # the error lists the candidates


def test_stacks_under_reads_the_homes_and_skips_a_broken_one(tmp_path: Path) -> None:
    live = stack_in(tmp_path, "digits", alive=True)
    stack_in(tmp_path, "sensors", alive=False)
    (tmp_path / ".scanflow" / "broken").mkdir()
    (tmp_path / ".scanflow" / "broken" / "stack.json").write_text("{not json")
    got = stacks_under(tmp_path)
    assert [(f.state.workflow, f.alive) for f in got] == [("digits", True), ("sensors", False)]
    assert find_home(tmp_path) == live


def test_status_without_home_finds_the_stack_here_or_says_there_is_none(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    none = CliRunner().invoke(app, ["status"])
    assert none.exit_code == 2 and "no stack under" in none.output
    stack_in(tmp_path, "digits", alive=False)  # its `up` is gone: status reads it and says so
    res = CliRunner().invoke(app, ["status", "--json"])
    assert res.exit_code == 1 and '"digits"' in res.output, res.output


# -- the CLI's habits -------------------------------------------------------------------------------------
def test_version_and_short_help() -> None:
    from importlib.metadata import version

    res = CliRunner().invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"scanflow {version('scanflow')}"
    for args in (["-h"], ["up", "-h"], ["serve", "-h"]):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 0 and "Usage:" in res.output, (args, res.output)


def test_validate_prints_one_line_or_nothing_or_the_yaml() -> None:
    plain = CliRunner().invoke(app, ["validate", str(DIGITS)])
    assert plain.exit_code == 0 and plain.output.strip().startswith("ok: workflow 'digits'")
    quiet = CliRunner().invoke(app, ["validate", "-q", str(DIGITS)])
    assert quiet.exit_code == 0 and quiet.output == ""
    yaml_out = CliRunner().invoke(app, ["validate", "--yaml", str(DIGITS)])
    assert yaml_out.exit_code == 0 and "name: digits" in yaml_out.stdout
    bad = CliRunner().invoke(app, ["validate", "-q", str(REPO / "no_such_workflow.py")])
    assert bad.exit_code == 2 and bad.output  # quiet never hides a problem


def test_init_takes_a_path(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["init", str(tmp_path / "models" / "churn")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "models" / "churn" / "workflow.py").is_file()
    both = CliRunner().invoke(app, ["init", str(tmp_path / "a" / "b"), "--dir", str(tmp_path)])
    assert both.exit_code == 2 and "use one of them" in both.output
    bad = CliRunner().invoke(app, ["init", str(tmp_path / "Bad-Name")])
    assert bad.exit_code == 2 and "lower-case" in bad.output


# -- decisions | plans | logs: the pure parts ------------------------------------------------------------
def test_decisions_of_all_agents_in_time_order_newest_kept() -> None:
    by_role = {"planner": [{"at": 30.0, "strategy": "p2"}, {"at": 10.0, "strategy": "p1"}],
               "executor": [{"at": 20.0, "strategy": "e1", "result": "fired", "reason": "ok"}]}
    rows = decision_rows(by_role, limit=2)
    assert [(r["agent"], r["strategy"]) for r in rows] == [("executor", "e1"), ("planner", "p2")]
    line = decision_line(rows[0])
    assert "executor" in line and "e1" in line and "fired" in line and "ok" in line
    assert plan_line({"at": None, "policy": "autoscale", "action": "hold", "reason": "r"}).startswith("-  autoscale")
    # what the actions did: the result's plain values, or the error
    rows[0]["outcomes"] = {"promote:7:0": {"status": "ok", "error": None,
                                           "result": {"version": "3", "alias": "champion", "gate": {"n": 1}}},
                           "notify:7:1": {"status": "failed", "error": "peer down", "result": {}}}
    line = decision_line(rows[0])
    assert line.endswith("-> promote ok (version=3, alias=champion); notify failed (peer down)"), line


def test_logs_lists_and_tails(tmp_path: Path) -> None:
    (tmp_path / "planner.log").write_text("".join(f"line {i}\n" for i in range(100)))
    (tmp_path / "executor.log").write_text("")
    (tmp_path / "notes.txt").write_text("x")
    assert log_names(tmp_path) == ["executor", "planner"]
    assert tail(tmp_path / "planner.log", 3) == ["line 97", "line 98", "line 99"]
    assert tail(tmp_path / "executor.log", 3) == []


def test_read_commands_refuse_bad_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = stack_in(tmp_path, "digits", alive=True)
    (home / "logs").mkdir()
    (home / "logs" / "planner.log").write_text("hello\n")
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["decisions", "--agent", "nope"])
    assert res.exit_code == 2 and "not an agent role" in res.output
    res = CliRunner().invoke(app, ["logs", "../../etc/passwd"])
    assert res.exit_code == 2 and "no log" in res.output and "planner" in res.output
    res = CliRunner().invoke(app, ["logs"])
    assert res.exit_code == 0 and res.output.split() == ["planner"]
    res = CliRunner().invoke(app, ["logs", "planner", "-n", "1"])
    assert res.exit_code == 0 and res.output == "hello\n"
    # an agent that does not answer: rc 1 and one line naming it, not a traceback
    res = CliRunner().invoke(app, ["plans"])
    assert res.exit_code == 1 and "127.0.0.1:1" in res.output and "Traceback" not in res.output
