"""The pure and local parts of `scanflow up | status | down` (no stack is started here).

State file round trip and refusal, the token file's mode, module-to-file resolution of AgentSpec.module,
the status rules, which processes belong to a home, `up` stopping on a signal (with a stand-in
stack), and one-line errors for bad input. The whole-stack run is tests/e2e/test_cli_up.py.
"""

from __future__ import annotations

import os
import signal
import stat
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from scanflow.agent.sources import AgentModuleError, module_file, split_module_ref
from scanflow.cli import app
from scanflow.embedded.agentfiles import agent_target
from scanflow.embedded.stack import EmbeddedStack, StackError
from scanflow.embedded.stackstatus import AgentProbe, Probe, classify, service_row
from scanflow.embedded.statefile import (
    Pid,
    StackState,
    StateError,
    is_alive,
    load_or_create_token,
    read_state,
    refusal,
    state_path,
    write_state,
)
from scanflow.embedded.teardown import belongs_to_home, mlflow_db_arg
from scanflow.embedded.up import UpError, addresses, prepare, run_up
from scanflow.spec import AgentSpec, Workflow

REPO = Path(__file__).resolve().parents[2]


def digits() -> Workflow:
    from scanflow.examples.digits.workflow import workflow

    return workflow


def state(home: Path, pid: Pid | None = None, **kw: Any) -> StackState:
    urls = {"mlflow": "http://127.0.0.1:1", "agents": {"tracker": "http://127.0.0.1:2"},
            "services": {"digits": "http://127.0.0.1:3"}, "predict": {"digits": "http://127.0.0.1:3/predict"},
            "feedback": "http://127.0.0.1:2/feedback"}
    return StackState(pid=pid or Pid.of(os.getpid()), workflow="digits", home=str(home),
                      log_dir=str(home / "logs"), token_file=str(home / "token"), urls=urls, **kw)


# -- stack.json ----------------------------------------------------------------------------------------
def test_state_round_trips_through_the_file(tmp_path: Path) -> None:
    s = state(tmp_path, state="running", phase="ready", pids={"mlflow": Pid(12, 34)})
    write_state(tmp_path, s)
    assert read_state(tmp_path) == s
    assert not state_path(tmp_path).with_suffix(".json.tmp").exists()


def test_no_state_file_reads_none_and_a_broken_one_says_why(tmp_path: Path) -> None:
    assert read_state(tmp_path) is None
    state_path(tmp_path).write_text("{not json")
    with pytest.raises(StateError, match="stack.json"):
        read_state(tmp_path)
    state_path(tmp_path).write_text('{"workflow": "digits"}')
    with pytest.raises(StateError, match="pid"):
        read_state(tmp_path)


def test_a_pid_is_alive_only_with_its_own_start_time() -> None:
    me = Pid.of(os.getpid())
    assert me.started is not None and is_alive(me)
    assert not is_alive(Pid(os.getpid(), me.started + 1))  # the same pid, another process


def test_refusal_only_for_a_live_up(tmp_path: Path) -> None:
    s = state(tmp_path)
    assert refusal(None, False) is None
    assert refusal(s, False) is None  # a stale stack.json does not block a new up
    why = refusal(s, True)
    assert why is not None and "scanflow down" in why and str(os.getpid()) in why


def test_prepare_refuses_a_home_a_live_up_owns_and_accepts_a_stale_one(tmp_path: Path) -> None:
    write_state(tmp_path, state(tmp_path))  # this test process plays the live `up`
    with pytest.raises(UpError, match="already runs"):
        prepare(tmp_path, None)
    me = Pid.of(os.getpid())
    write_state(tmp_path, state(tmp_path, pid=Pid(me.pid, (me.started or 0) + 1)))
    path, token = prepare(tmp_path, None)
    assert path == (tmp_path / "token").resolve() and token


# -- the token file ------------------------------------------------------------------------------------
def test_token_file_is_created_private_and_reused(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "token"
    token = load_or_create_token(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(token) >= 24 and load_or_create_token(path) == token


def test_a_token_file_others_can_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("sekrit\n")
    path.chmod(0o644)
    with pytest.raises(ValueError, match="readable by others"):
        load_or_create_token(path)


# -- AgentSpec.module -> file --------------------------------------------------------------------------
@pytest.mark.parametrize(("ref", "parts"), [("scanflow.standard.tracker:agent", ("scanflow.standard.tracker", "agent")),
                                            ("pkg.mod", ("pkg.mod", None)), (" a:b ", ("a", "b"))])
def test_split_module_ref(ref: str, parts: tuple[str, str | None]) -> None:
    assert split_module_ref(ref) == parts


@pytest.mark.parametrize("ref", ["", ":agent", "scanflow.standard.tracker:", "agents tracker:agent", "a.b:c.d", "1a:b"])
def test_split_module_ref_refuses_malformed_refs(ref: str) -> None:
    with pytest.raises(AgentModuleError, match="package.module:attr"):
        split_module_ref(ref)


def test_module_file_finds_the_source_without_importing_it() -> None:
    import sys

    sys.modules.pop("scanflow.standard.checker", None)
    assert module_file("scanflow.standard.checker:agent") == REPO / "scanflow" / "standard" / "checker.py"
    assert "scanflow.standard.checker" not in sys.modules  # found, not imported (it would read the workflow)


@pytest.mark.parametrize(("ref", "why"), [("agents.nope:agent", "cannot be found"),
                                          ("no_such_pkg_xyz.mod:agent", "cannot be found"),
                                          ("sys:agent", "no Python source")])
def test_module_file_says_what_is_wrong(ref: str, why: str) -> None:
    with pytest.raises(AgentModuleError, match=why):
        module_file(ref)


def test_agent_target_falls_back_to_the_agents_dir(tmp_path: Path) -> None:
    assert agent_target("planner", None, tmp_path) == str(tmp_path / "planner.py")
    spec = AgentSpec(name="plan-b", role="planner")
    assert agent_target("planner", spec, tmp_path) == str(tmp_path / "planner.py")
    spec = AgentSpec(name="plan-b", role="planner", module="scanflow.standard.planner:agent")
    assert agent_target("planner", spec, tmp_path) == "scanflow.standard.planner:agent"  # bound to plan-b at start


def test_the_stack_runs_the_declared_module_on_the_declared_port(tmp_path: Path) -> None:
    wf = digits()
    agents = [a.model_copy(update={"port": 18765}) if a.role == "checker" else a for a in wf.agents]
    stack = EmbeddedStack(tmp_path, wf.model_copy(update={"agents": agents}))
    assert stack.ports["checker"] == 18765
    argv = stack._argv("checker")
    assert argv[argv.index("run") + 1] == "scanflow.standard.checker:agent"  # bound to the workflow at start
    assert "--name" not in argv and argv[argv.index("--port") + 1] == "18765"
    assert stack._env("checker")["SCANFLOW_WORKFLOW"] == str(tmp_path / "workflow.yaml")


def test_the_stack_refuses_a_module_that_does_not_exist_before_starting_anything(tmp_path: Path) -> None:
    wf = digits()
    agents = [a.model_copy(update={"module": "agents.missing:agent"}) if a.role == "tracker" else a
              for a in wf.agents]
    with pytest.raises(StackError, match="agents.missing"):
        EmbeddedStack(tmp_path / "h", wf.model_copy(update={"agents": agents}))
    assert not (tmp_path / "h").exists()


# -- status rules --------------------------------------------------------------------------------------
SERVICE_OK = {"desired_replicas": 1, "replicas": [{"ready": True, "model_version": "3"}], "routed_to": "digits"}


def probe(tmp_path: Path, **kw: Any) -> Probe:
    args: dict[str, Any] = {"state": state(tmp_path, state="running"), "up_alive": True, "mlflow_ok": True,
                            "agents": [AgentProbe("tracker", "u", "tracker", {"queue_depth": 0, "processed": 4})],
                            "services": {"digits": SERVICE_OK}}
    args.update(kw)
    return Probe(**args)


def test_all_up_is_rc_0(tmp_path: Path) -> None:
    report = classify(probe(tmp_path))
    assert report.rc == 0 and {r.health for r in report.rows} == {"up"}
    assert "processed 4" in next(r.detail for r in report.rows if r.kind == "agent")


@pytest.mark.parametrize("change", [
    {"up_alive": False},
    {"mlflow_ok": False},
    {"agents": [AgentProbe("tracker", "u", None, None, "ConnectError")]},
    {"services": None, "services_error": "HTTP 503"},
    {"services": {}},  # the Executor does not report the service
    {"state": None},  # still starting
])
def test_anything_down_or_still_starting_is_rc_1(tmp_path: Path, change: dict[str, Any]) -> None:
    if change.get("state", 0) is None:
        change = {"state": state(tmp_path, state="starting", phase="bootstrap: training")}
    report = classify(probe(tmp_path, **change))
    assert report.rc == 1
    assert any(r.health in ("down", "starting") for r in report.rows)


def test_service_rows() -> None:
    assert service_row("s", "u", SERVICE_OK).health == "up"
    two = {"desired_replicas": 2, "replicas": [{"ready": True}, {"ready": False}]}
    assert service_row("s", "u", two).health == "degraded"
    none = {"desired_replicas": 1, "replicas": [{"ready": False}]}
    assert service_row("s", "u", none).health == "down"
    routed = service_row("digits", "u", {**SERVICE_OK, "routed_to": "digits-backup"})
    assert "routed to digits-backup" in routed.detail and "model 3" in routed.detail
    assert service_row("s", "u", {"error": "no such service"}).health == "down"


# -- which processes belong to a home ------------------------------------------------------------------
def env(*pairs: str) -> dict[str, str]:
    return dict(p.split("=", 1) for p in pairs)


@pytest.mark.parametrize(("argv", "environ", "ours"), [
    (["python", "-m", "scanflow.cli", "agent", "run", "a.py"], env("SCANFLOW_HOME=/h/agents/tracker"), True),
    (["python", "-m", "scanflow.serving.replica"], env("A=1", "SCANFLOW_HOME=/h/agents/executor"), True),
    (["python", "-m", "scanflow.embedded.bootstrap"], env("SCANFLOW_HOME=/h/agents/bootstrap"), True),
    (["mlflow", "server", "--backend-store-uri", "sqlite:////h/mlflow/mlflow.db"], env(), True),
    (["python", "-m", "scanflow.cli", "agent", "run"], env("SCANFLOW_HOME=/h2/agents/tracker"), False),
    (["python", "-m", "scanflow.cli", "status", "--home", "/h"], env("HOME=/root"), False),
    (["tail", "-f", "/h/logs/tracker.log"], env("SCANFLOW_HOME=/h/agents/tracker"), False),
    (["mlflow", "server", "--backend-store-uri", "sqlite:////h2/mlflow/mlflow.db"], env(), False),
])
def test_belongs_to_home(argv: list[str], environ: dict[str, str], ours: bool) -> None:
    assert mlflow_db_arg(Path("/h")) == "sqlite:////h/mlflow/mlflow.db"
    assert belongs_to_home(argv, environ, "/h") is ours


# -- up: the signal path, with a stand-in stack --------------------------------------------------------
class FakeStack:
    """What run_up uses of EmbeddedStack; start() sends this process a signal, as Ctrl-C would."""

    def __init__(self, home: Path, workflow: Workflow, *, token: str, quick: bool, on_progress: Any,
                 sig: int = signal.SIGTERM) -> None:
        self.home, self.on_progress, self.sig = home, on_progress, sig
        self.agent_urls = {"tracker": "http://127.0.0.1:2"}
        self.service_urls = {"digits": "http://127.0.0.1:3"}
        self.service_url = "http://127.0.0.1:3"
        self.tracking_uri = ""
        self.token = token
        self.stopped = 0
        self.state_seen: StackState | None = None

    def pids(self) -> dict[str, int]:
        return {}

    def start(self) -> None:
        self.on_progress("mlflow: starting")
        self.state_seen = read_state(self.home)
        os.kill(os.getpid(), self.sig)

    def alive(self, role: str) -> bool:
        return True

    def log_path(self, role: str) -> Path:
        return self.home / f"{role}.log"

    def stop(self) -> None:
        self.stopped += 1


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_up_stops_everything_on_a_signal_and_removes_its_state(tmp_path: Path, sig: int) -> None:
    made: list[FakeStack] = []
    lines: list[str] = []

    def factory(*a: Any, **kw: Any) -> FakeStack:
        made.append(FakeStack(*a, **kw, sig=sig))
        return made[0]

    before = signal.getsignal(sig)
    rc = run_up(digits(), tmp_path, quick=True, token_file=None, echo=lines.append,
                stack_factory=factory)  # type: ignore[arg-type]
    assert rc == 0 and made[0].stopped == 1
    seen = made[0].state_seen
    assert seen is not None and seen.state == "starting" and seen.phase == "mlflow: starting"
    assert seen.pid.pid == os.getpid()
    assert not state_path(tmp_path).exists()
    assert signal.getsignal(sig) == before
    assert made[0].token not in "\n".join(lines)  # the token is never echoed
    assert lines[-1] == "stopped"


def test_addresses_name_every_endpoint_and_where_the_token_is(tmp_path: Path) -> None:
    text = addresses(state(tmp_path))
    for needle in ("http://127.0.0.1:1", "http://127.0.0.1:3/predict", "http://127.0.0.1:2/feedback",
                   "agent tracker", str(tmp_path / "token"), "scanflow down --home"):
        assert needle in text


# -- the commands: bad input is one line, rc 2 ---------------------------------------------------------
runner = CliRunner()


@pytest.mark.parametrize(("content", "suffix", "needle"), [
    ("x = 1 / 0\n", ".py", "ZeroDivisionError"),
    ("workflow = 3\n", ".py", "expected scanflow.spec.Workflow"),
    ("name: Not_A_Name\n", ".yaml", "name"),
    (None, ".yaml", "does not exist"),
])
def test_up_with_a_bad_workflow_file_is_one_line_rc_2(tmp_path: Path, content: str | None, suffix: str,
                                                      needle: str) -> None:
    f = tmp_path / f"wf{suffix}"
    if content is not None:
        f.write_text(content)
    r = runner.invoke(app, ["up", str(f), "--home", str(tmp_path / "h")])
    assert r.exit_code == 2, r.output
    assert needle in r.output and len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output
    assert not (tmp_path / "h").exists()


def test_up_refuses_a_home_with_a_live_up(tmp_path: Path) -> None:
    write_state(tmp_path, state(tmp_path))
    r = runner.invoke(app, ["up", str(REPO / "workflows" / "digits" / "workflow.py"), "--home", str(tmp_path)])
    assert r.exit_code == 2 and "already runs" in r.output and len(r.output.strip().splitlines()) == 1


@pytest.mark.parametrize("cmd", ["status", "down"])
def test_status_and_down_without_a_stack_are_rc_2(tmp_path: Path, cmd: str) -> None:
    r = runner.invoke(app, [cmd, "--home", str(tmp_path)])
    assert r.exit_code == 2 and "no stack" in r.output
    state_path(tmp_path).write_text("[]")
    r = runner.invoke(app, [cmd, "--home", str(tmp_path)])
    assert r.exit_code == 2 and "not a JSON object" in r.output and "Traceback" not in r.output


def test_one_line_joins_a_multi_line_message() -> None:
    from scanflow.embedded.cli import one_line

    assert one_line("invalid workflow:\n  name = 'X': bad\n  jobs.0: worse\n") == \
        "invalid workflow: name = 'X': bad; jobs.0: worse"
    assert one_line("plain") == "plain"
