"""`scanflow up | status | down` on a real stack, as a user runs them (subprocesses of the CLI).

One `up` of the digits workflow (--quick) is checked from outside: stack.json appears, `status` says
all up, the printed service URL answers POST /predict, `plans`, `decisions` and `logs` read what the
agents did, `down` stops it and nothing of the home is
left in /proc. A second `up` in the same home (the bootstrap finds its champion, so it starts faster)
is stopped with SIGINT, as Ctrl-C would, and must leave nothing behind either.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2e_support import wait_for

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / "workflows" / "digits" / "workflow.py"
# MLflow start, bootstrap training (30-90 s on a busy 2-core machine) and four agents; generous
READY_S = 480.0
STOP_S = 150.0


def cli(*args: str, timeout_s: float = 180.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "scanflow.cli", *args], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=timeout_s, check=False)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def processes_mentioning(home: Path) -> list[tuple[int, str]]:
    """Live processes (not this one) whose command line or environment names `home`."""
    needle = str(home).encode()
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
            if needle in cmd or needle in (d / "environ").read_bytes():
                found.append((int(d.name), cmd.replace(b"\0", b" ").decode(errors="replace")[:160]))
        except OSError:
            continue
    return found


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One home for both tests: the second `up` reuses the first one's champion and detector."""
    return tmp_path_factory.mktemp("cli-up") / "digits"


class Up:
    """A running `scanflow up` subprocess, its output in a file outside the home."""

    def __init__(self, home: Path, out: Path) -> None:
        self.home, self.out = home, out
        with open(out, "wb") as f:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "scanflow.cli", "up", str(WORKFLOW), "--quick", "--home", str(home)],
                cwd=REPO, env=_env(), stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def state(self) -> dict | None:  # type: ignore[type-arg]
        try:
            return json.loads((self.home / "stack.json").read_text())
        except (OSError, ValueError):
            return None

    def wait_running(self) -> dict:  # type: ignore[type-arg]
        def running() -> dict | None:  # type: ignore[type-arg]
            if self.proc.poll() is not None:
                pytest.fail(f"up exited with {self.proc.returncode}:\n{self.output()}")
            s = self.state()
            return s if s and s.get("state") == "running" else None
        return wait_for(running, READY_S, 1.0, "stack.json to say running")  # type: ignore[no-any-return]

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        if (self.home / "stack.json").exists():
            cli("down", "--home", str(self.home), "--timeout", "5")


@pytest.fixture
def up(home: Path, tmp_path: Path) -> Iterator[Up]:
    u = Up(home, tmp_path / "up.out")
    yield u
    u.cleanup()


def assert_all_gone(u: Up) -> None:
    assert u.proc.wait(timeout=STOP_S) == 0, u.output()
    assert not (u.home / "stack.json").exists()
    wait_for(lambda: not processes_mentioning(u.home), 10.0, 0.2, "the stack's processes to be gone")
    assert "stopped" in u.output().splitlines()[-1]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_up_status_predict_down(up: Up) -> None:
    state = up.wait_running()
    assert state["pid"]["pid"] == up.proc.pid and state["workflow"] == "digits"
    token = (up.home / "token").read_text().strip()
    assert (up.home / "token").stat().st_mode & 0o777 == 0o600

    status = wait_for(lambda: (r := cli("status", "--home", str(up.home), "--json")).returncode == 0 and r,
                      60.0, 1.0, "status rc 0")
    report = json.loads(status.stdout)
    kinds = {(c["kind"], c["name"]): c["health"] for c in report["components"]}
    assert kinds[("agent", "executor")] == "up" and kinds[("service", "digits")] == "up", report
    assert cli("status", "--workflow-name", "nope").returncode == 2

    out = up.output()
    for phase in ("mlflow: up at", "bootstrap:", "agent executor: healthy", "services: ready", "/feedback"):
        assert phase in out, out
    assert token not in out and token not in status.stdout
    url = next(line.split()[2] for line in out.splitlines() if line.strip().startswith("service digits "))
    assert url.endswith("/predict")
    r = httpx.post(url, json={"inputs": [[0.0] * 64]}, timeout=30.0)
    assert r.status_code == 200 and "outputs" in r.json(), r.text

    # what the agents did, read from the terminal (scanflow/embedded/readcli.py)
    plans = cli("plans", "--home", str(up.home), "--json", "-n", "5")
    assert plans.returncode == 0 and isinstance(json.loads(plans.stdout), list), plans.stderr
    assert len(json.loads(plans.stdout)) <= 5
    decisions = cli("decisions", "--home", str(up.home), "--json", "--agent", "executor")
    assert decisions.returncode == 0, decisions.stderr
    assert all(d["agent"] == "executor" for d in json.loads(decisions.stdout))
    logs = cli("logs", "--home", str(up.home))
    assert logs.returncode == 0 and {"executor", "planner"} <= set(logs.stdout.split()), logs.stdout
    tail = cli("logs", "executor", "-n", "3", "--home", str(up.home))
    assert tail.returncode == 0 and len(tail.stdout.splitlines()) <= 3 and token not in tail.stdout

    again = cli("up", str(WORKFLOW), "--home", str(up.home))
    assert again.returncode == 2 and "already runs" in again.stderr

    down = cli("down", "--home", str(up.home), timeout_s=STOP_S + 30)
    assert down.returncode == 0, down.stdout + down.stderr
    assert_all_gone(up)
    assert cli("status", "--home", str(up.home)).returncode == 2


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ctrl_c_stops_everything(up: Up) -> None:
    state = up.wait_running()
    recorded = [p["pid"] for p in state["pids"].values()]
    assert set(state["pids"]) >= {"mlflow", "tracker", "checker", "planner", "executor"}
    assert processes_mentioning(up.home)  # the check below can see the stack's processes
    up.proc.send_signal(signal.SIGINT)
    assert_all_gone(up)
    assert not [p for p in recorded if Path(f"/proc/{p}").exists()]
