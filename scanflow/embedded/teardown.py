"""`scanflow down`: stop the `up` of a home, and make sure nothing of that stack is left.

The polite way first: SIGTERM to the `up` process, which stops what it started (EmbeddedStack.stop)
and removes stack.json; `down` waits for both, bounded. If `up` does not finish in time (or was
SIGKILLed earlier, leaving a stale stack.json), `down` SIGKILLs it and sweeps: the processes stack.json
recorded (MLflow, agents; by pid and start time, so a reused pid is spared), any agent, bootstrap,
replica, gateway or job whose SCANFLOW_HOME lies under `<home>/agents/`, and the MLflow server of the
home's database. Only processes that run a scanflow module or that MLflow server are touched: a
`tail -f` of a log in the home is not ours to kill. The sweep reads processes through psutil
(scanflow.platform.processes.scan_proc).
Who calls: scanflow.embedded.cli (down), tests.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from scanflow.embedded.leftovers import kill_leftovers
from scanflow.embedded.statefile import Pid, StackState, is_alive, remove_state, state_path
from scanflow.platform import processes as procs

# what a process of a stack runs (an argv element): agents, the bootstrap, services and jobs
STACK_MODULES = ("scanflow.cli", "scanflow.embedded.bootstrap", "scanflow.serving.gateway",
                 "scanflow.serving.replica", "scanflow.platform.jobrunner")


@dataclass
class DownResult:
    """What `down` did: whether `up` stopped by itself, what the sweep killed, what is still alive."""

    up_was_alive: bool = False
    graceful: bool = False
    killed: list[int] = field(default_factory=list)
    left: list[int] = field(default_factory=list)


def mlflow_db_arg(home: Path) -> str:
    """The --backend-store-uri value of the home's MLflow server (scanflow.tracking.server.MlflowServer)."""
    return f"sqlite:///{Path(home).resolve() / 'mlflow' / 'mlflow.db'}"


def belongs_to_home(argv: list[str], environ: dict[str, str], home: str) -> bool:
    """Pure: is this process (its argv and environment) part of the stack in `home`?

    Yes for a scanflow module whose SCANFLOW_HOME is `home/agents/<anything>` (agents, bootstrap, and
    the Executor's replicas, gateways and jobs, which inherit its home), and for the MLflow server of
    `home`'s database. `home` must be absolute and resolved.
    """
    if mlflow_db_arg(Path(home)) in argv:
        return True
    if not any(m in argv for m in STACK_MODULES):
        return False
    return environ.get("SCANFLOW_HOME", "").startswith(f"{home.rstrip('/')}/agents/")


def processes_of(home: Path, exclude: set[int] | None = None) -> list[int]:
    """Pids (not ours, not `exclude`) that `belongs_to_home` names."""
    h = str(Path(home).resolve())
    return procs.scan_proc(lambda argv, environ: belongs_to_home(argv, environ, h), exclude)


def _kill(p: Pid) -> None:
    """SIGKILL a recorded process (its group when it leads one), only if it is still the same process."""
    if not is_alive(p):
        return
    try:
        if os.getpgid(p.pid) == p.pid:
            os.killpg(p.pid, signal.SIGKILL)
        else:
            os.kill(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def sweep(home: Path, state: StackState | None) -> DownResult:
    """SIGKILL everything of the stack in `home` that still runs; what was killed and what is left."""
    result = DownResult()
    if state is not None:
        for p in [state.pid, *state.pids.values()]:
            if is_alive(p):
                result.killed.append(p.pid)
                _kill(p)
    found = processes_of(home)
    result.killed += found
    result.left = procs.kill_groups(found)
    result.killed += kill_leftovers(Path(home) / "agents" / "executor")  # as the stack's own stop does
    result.left += processes_of(home)
    return result


def down(home: Path, state: StackState, timeout_s: float,
         wait: Callable[[Callable[[], bool], float], bool] | None = None) -> DownResult:
    """SIGTERM `up`, wait up to `timeout_s` for it to exit and remove stack.json; else SIGKILL and sweep.

    The sweep runs in both cases (a graceful stop leaves nothing, so it then finds nothing).
    """
    wait = wait or (lambda cond, t: procs.wait_until(cond, t, 0.2))
    graceful = False
    up_was_alive = is_alive(state.pid)
    if up_was_alive:  # else a stale stack.json: `up` died without stopping anything, sweep at once
        try:
            os.kill(state.pid.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        graceful = wait(lambda: not is_alive(state.pid) and not state_path(home).exists(), timeout_s)
    result = sweep(home, state)
    result.graceful = graceful
    result.up_was_alive = up_was_alive
    remove_state(home)
    return result
