"""`<home>/stack.json` and `<home>/token`: how `scanflow status` and `down` find a running `up`.

`scanflow up` writes stack.json as it starts (state "starting", the phase it is in, the pids it
knows so far) and again once everything is ready ("running"); it removes the file when it has
stopped everything. The file holds no secret: the token lives in its own file (mode 0600) and
stack.json only says where. A pid is recorded with its start time (clock ticks since boot,
scanflow.platform.processes.start_time), so a pid the OS later gave to another process is not
mistaken for ours.
Who calls: scanflow.embedded.up (writes), scanflow.embedded.stackstatus and .teardown (read).
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from scanflow.platform.processes import start_time

STATE_FILE = "stack.json"
TOKEN_FILE = "token"
STATE_VERSION = 1


class StateError(ValueError):
    """stack.json is there but unreadable or not what `up` writes (the message says which)."""


@dataclass(frozen=True)
class Pid:
    """A process as `up` saw it: its pid and start time (None where it could not be read)."""

    pid: int
    started: int | None = None

    @classmethod
    def of(cls, pid: int) -> Pid:
        return cls(pid, start_time(pid))


@dataclass(frozen=True)
class StackState:
    """What stack.json holds. `urls`: "mlflow", "agents" {role: url}, "services" {name: gateway url},
    "predict" {name: url/predict}, "feedback" (the Tracker's); `pids`: "mlflow" and agent roles."""

    pid: Pid
    workflow: str
    home: str
    log_dir: str
    token_file: str
    state: str = "starting"  # "starting" | "running"
    phase: str = ""
    urls: dict[str, Any] = field(default_factory=dict)
    pids: dict[str, Pid] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, data: Any) -> StackState:
        """Pure: parse what to_dict wrote; StateError naming the problem otherwise."""
        if not isinstance(data, dict):
            raise StateError("not a JSON object")
        try:
            return cls(
                pid=Pid(**data["pid"]),
                workflow=str(data["workflow"]),
                home=str(data["home"]),
                log_dir=str(data["log_dir"]),
                token_file=str(data["token_file"]),
                state=str(data.get("state", "starting")),
                phase=str(data.get("phase", "")),
                urls=dict(data.get("urls") or {}),
                pids={k: Pid(**v) for k, v in (data.get("pids") or {}).items()},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise StateError(f"missing or malformed field: {exc}") from None


def state_path(home: Path) -> Path:
    return Path(home) / STATE_FILE


def default_home(workflow_name: str) -> Path:
    """Where `up` keeps a workflow's stack when --home is not given (relative to the current dir)."""
    return Path(".scanflow") / workflow_name


def write_state(home: Path, state: StackState) -> None:
    """Write stack.json atomically (a reader never sees half a file)."""
    path = state_path(home)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state.to_dict(), indent=2) + "\n")
    os.replace(tmp, path)


def read_state(home: Path) -> StackState | None:
    """The stack.json in `home`, None when there is none; StateError when it cannot be read."""
    path = state_path(home)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateError(f"{path}: {exc.strerror}") from None
    try:
        return StackState.from_dict(json.loads(text))
    except (ValueError, StateError) as exc:
        raise StateError(f"{path}: {exc}") from None


def remove_state(home: Path) -> None:
    for p in (state_path(home), state_path(home).with_suffix(".json.tmp")):
        p.unlink(missing_ok=True)


def is_alive(p: Pid) -> bool:
    """The recorded process still runs (same start time where one was recorded)."""
    if p.started is not None:
        return start_time(p.pid) == p.started
    try:
        os.kill(p.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def refusal(state: StackState | None, up_alive: bool) -> str | None:
    """Pure: why a new `up` must not start in this home (a live `up` owns it), or None."""
    if state is None or not up_alive:
        return None
    return (f"a stack of workflow {state.workflow!r} already runs in {state.home} (up pid {state.pid.pid}); "
            f"stop it with `scanflow down --home {state.home}`")


def load_or_create_token(path: Path) -> str:
    """The token in `path` when it holds one, else a new one written there with mode 0600.

    Why reuse: clients configured with a home's token keep working across restarts. A file that
    others may read is refused (ValueError), since the token guards every mutating agent call.
    """
    if path.exists():
        mode = path.stat().st_mode & 0o077
        if mode:
            raise ValueError(f"token file {path} is readable by others (mode {path.stat().st_mode & 0o777:o}); "
                             "chmod 600 it or remove it")
        token = path.read_text().strip()
        if token:
            return token
    token = secrets.token_urlsafe(24)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.chmod(path, 0o600)  # an existing empty file keeps its mode through O_CREAT
    return token


def read_token(path: str | Path) -> str | None:
    """The token for status calls, None when the file is gone or unreadable (status still reads)."""
    try:
        return Path(path).read_text().strip() or None
    except OSError:
        return None
