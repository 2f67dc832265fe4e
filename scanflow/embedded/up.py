"""`scanflow up`: run a workflow's whole embedded stack in the foreground until Ctrl-C or SIGTERM.

Order: refuse when a live `up` already owns the home; read or create the token file (0600; the token
is never printed); start the EmbeddedStack, echoing one line per phase and keeping stack.json up to
date (state "starting", the phase, the pids known so far); once ready, print the addresses and mark
stack.json "running"; then wait. The first SIGINT, SIGTERM or SIGHUP stops everything the stack
started (EmbeddedStack.stop) and removes stack.json; later signals while stopping are only reported,
so a second Ctrl-C cannot leave half a stack behind.
Who calls: scanflow.embedded.cli (up).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from scanflow.embedded.stack import ROLES, EmbeddedStack, StackError
from scanflow.embedded.statefile import (
    TOKEN_FILE,
    Pid,
    StackState,
    StateError,
    is_alive,
    load_or_create_token,
    read_state,
    refusal,
    remove_state,
    write_state,
)
from scanflow.private_files import PRIVATE_UMASK, private_dir
from scanflow.spec import Workflow

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
WATCH_INTERVAL_S = 1.0


class UpError(ValueError):
    """`up` cannot start here (a live stack owns the home, a bad token file, a wrong agent module)."""


class _Stop(BaseException):
    """Raised by the signal handler: leave whatever the main thread does and stop the stack."""


def urls_of(stack: EmbeddedStack) -> dict[str, object]:
    """The addresses stack.json records (pure over the stack's fixed ports)."""
    agents = stack.agent_urls
    services = stack.service_urls
    return {"mlflow": stack.tracking_uri or None, "agents": agents, "services": services,
            "primary": stack.service_url,  # the endpoint clients use (the service that names a backup)
            "predict": {n: f"{u}/predict" for n, u in services.items()},
            "feedback": f"{agents['tracker']}/feedback"}


def addresses(state: StackState) -> str:
    """Pure: the block `up` prints once the stack is ready (never the token, only where it is)."""
    u = state.urls
    rows = [("MLflow UI", str(u.get("mlflow")), "login: user 'operator', password: the token")]
    rows += [(f"service {n}", url, "POST, gateway") for n, url in dict(u.get("predict") or {}).items()]
    rows.append(("feedback", str(u.get("feedback")), "POST, Tracker"))
    rows += [(f"agent {r}", url, "") for r, url in dict(u.get("agents") or {}).items()]
    rows += [("token", state.token_file, "mode 0600; sent as 'Authorization: Bearer ...'"),
             ("logs", state.log_dir, ""), ("state", str(Path(state.home) / "stack.json"), "")]
    width = max(len(r[0]) for r in rows)
    lines = [f"stack {state.workflow!r} is up:"]
    lines += [f"  {name:<{width}}  {value}" + (f"  ({note})" if note else "") for name, value, note in rows]
    lines.append(f"stop it with Ctrl-C, or `scanflow down --home {state.home}`")
    return "\n".join(lines)


def prepare(home: Path, token_file: Path | None) -> tuple[Path, str]:
    """Refuse a home a live `up` owns; (token file path, token). UpError with one line otherwise."""
    try:
        state = read_state(home)
    except StateError as exc:
        raise UpError(f"{exc} (remove it if no stack runs there)") from None
    why = refusal(state, state is not None and is_alive(state.pid))
    if why:
        raise UpError(why)
    path = (token_file or home / TOKEN_FILE).resolve()
    try:
        return path, load_or_create_token(path)
    except (OSError, ValueError) as exc:
        raise UpError(f"token file: {exc}") from None


def run_up(workflow: Workflow, home: Path, *, quick: bool, token_file: Path | None,
           echo: Callable[[str], None], stack_factory: Callable[..., EmbeddedStack] = EmbeddedStack) -> int:
    """Run the stack until a stop signal; 0 after a clean stop, 1 when it could not start.

    Raises UpError (the caller prints it, rc 2) before anything was started.
    """
    home = home.resolve()
    os.umask(PRIVATE_UMASK)  # this process and all it starts create private files (scanflow.private_files)
    private_dir(home)
    token_path, token = prepare(home, token_file)
    t0 = time.monotonic()
    me = Pid.of(os.getpid())
    holder: list[EmbeddedStack] = []

    def snapshot(state: str, phase: str) -> StackState:
        stack = holder[0]
        return StackState(pid=me, workflow=workflow.name, home=str(home), log_dir=str(home / "logs"),
                          token_file=str(token_path), state=state, phase=phase, urls=urls_of(stack),
                          pids={k: Pid.of(v) for k, v in stack.pids().items()})

    def progress(line: str) -> None:
        echo(f"[{time.monotonic() - t0:6.1f}s] {line}")
        write_state(home, snapshot("starting", line))

    try:
        stack = stack_factory(home, workflow, token=token, quick=quick, on_progress=progress)
    except StackError as exc:
        raise UpError(str(exc)) from None
    holder.append(stack)
    write_state(home, snapshot("starting", "starting"))
    echo(f"scanflow up: workflow {workflow.name!r} in {home} (logs in {home / 'logs'})")
    previous: dict[signal.Signals, object] = {}
    rc = 0
    try:
        previous.update({s: signal.signal(s, _raise_stop) for s in STOP_SIGNALS})
        stack.start()
        state = snapshot("running", "ready")
        write_state(home, state)
        echo(addresses(state))
        _watch(stack, echo)
    except _Stop:
        pass
    except StackError as exc:
        echo(f"error: the stack could not start: {exc}")
        rc = 1
    finally:
        for s in STOP_SIGNALS:
            signal.signal(s, _already_stopping)
        echo("stopping: agents (the Executor stops its services), leftovers, MLflow ...")
        stack.stop()
        remove_state(home)
        echo("stopped")
        for signum, handler in previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]  # what signal.signal returned before
    return rc


def _watch(stack: EmbeddedStack, echo: Callable[[str], None]) -> None:
    """Wait for a stop signal; say once when an agent process exits (status shows it too)."""
    reported: set[str] = set()
    while True:
        time.sleep(WATCH_INTERVAL_S)
        for role in ROLES:
            if role not in reported and not stack.alive(role):
                reported.add(role)
                echo(f"warning: agent {role} exited; see {stack.log_path(role)}")


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    for s in STOP_SIGNALS:  # from now on, signals are reported, not raised: stopping must finish
        signal.signal(s, signal.SIG_IGN)
    raise _Stop


def _already_stopping(signum: int, frame: FrameType | None) -> None:
    # os.write, not print: the signal may land inside a print, and a buffered stream is not reentrant
    os.write(2, f"{signal.Signals(signum).name}: already stopping, please wait\n".encode())
