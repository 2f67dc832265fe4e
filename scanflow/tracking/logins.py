"""The logins of a local MLflow server started outside the embedded stack: generated once per MLflow
home into a file only its owner can read, and read back by whoever starts or reuses that server.

Why: `scanflow mlflow up`, `ensure_tracking` (`scanflow deploy --platform local`) and the demo's
fallback MLflow used to run MLflow with no login on a TCP port, so anyone who could reach the port
could delete experiments or move the `champion` alias (code execution in every replica at its next
swap). They now run it like the embedded stack does (scanflow.tracking.server.MlflowServer with
`users`: MLflow on a private Unix socket, the authenticating proxy on the TCP port), with these logins.
Unlike the stack's, which are minted per start and live only in its processes' environments, these
persist in `<home>/logins.json` (mode 0600): a server started by `scanflow mlflow up` is reused by
`ensure_tracking` in another process, which needs the same logins.

One login per kind of component, as in the stack (roles: scanflow.tracking.mlflow_proxy):
`operator` admin (you, the CLI, the process that called ensure_tracking), `executor` executor (the
one agent that moves aliases), `agent` writer (the other agents), `job` job (may not move `champion`),
`replica` reader. A file written before the `executor` login existed keeps working without it. Who calls: scanflow.tracking.cli (`mlflow up`),
scanflow.tracking.server.ensure_tracking, scanflow.demo.runner.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

from scanflow.credentials import MLFLOW_PASSWORD, MLFLOW_USER, kind_vars

LOGINS_FILE = "logins.json"
LOCAL_ROLES: dict[str, str] = {"operator": "admin", "executor": "executor", "agent": "writer", "job": "job",
                               "replica": "reader"}

Logins = dict[str, tuple[str, str]]  # name -> (password, role), what MlflowServer(users=) takes


class LoginsFileError(RuntimeError):
    """The logins file is unreadable, malformed or readable by others (the message says which)."""


def logins_path(home: Path) -> Path:
    return Path(home) / LOGINS_FILE


def load_or_create(home: Path) -> Logins:
    """The logins of the MLflow server in `home`: read from `home/logins.json`, or generated into it
    (mode 0600, created atomically: two processes starting at once end up with the same logins)."""
    path = logins_path(home)
    if not path.exists():
        Path(home).mkdir(parents=True, exist_ok=True)
        fresh = {name: {"password": secrets.token_urlsafe(24), "role": role} for name, role in LOCAL_ROLES.items()}
        fd, tmp = tempfile.mkstemp(dir=home, prefix=".logins-")  # mkstemp: mode 0600
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(fresh, f, indent=1)
            try:
                os.link(tmp, path)  # fails when another process made it first: theirs wins
            except FileExistsError:
                pass
        finally:
            os.unlink(tmp)
    return read(path)


def read(path: Path) -> Logins:
    """Pure but for the read: the logins in `path`; LoginsFileError when group or others may read it."""
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise LoginsFileError(f"cannot read the MLflow logins {str(path)!r} ({exc.strerror})") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise LoginsFileError(f"the MLflow logins {str(path)!r} are readable by others (mode {stat.S_IMODE(mode):o}); "
                              f"run `chmod 600 {path}`")
    try:
        doc = json.loads(text)
        out = {str(n): (str(v["password"]), str(v["role"])) for n, v in doc.items()}
    except (ValueError, TypeError, KeyError, AttributeError):
        raise LoginsFileError(f"the MLflow logins {str(path)!r} are not a JSON object of "
                              '{"name": {"password", "role"}}') from None
    if "operator" not in out:
        raise LoginsFileError(f"the MLflow logins {str(path)!r} have no 'operator' login")
    return out


def client_env(logins: Mapping[str, tuple[str, str]]) -> dict[str, str]:
    """Pure: the variables that make this process the operator and hand the platform's children their
    own logins (scanflow.credentials.child_env: a replica reads, a Job may not move `champion`)."""
    env = {MLFLOW_USER: "operator", MLFLOW_PASSWORD: logins["operator"][0]}
    for kind in ("replica", "job"):
        if kind in logins:
            _, user_var, password_var = kind_vars(kind)
            env[user_var], env[password_var] = kind, logins[kind][0]
    return env
