"""Which credentials a process the Executor starts (replica, gateway, Job) gets: only its own.

Why: the local platform used to hand every child the Executor's whole environment, so each replica and
Job held the Executor's token (actuators, serving admin) and its MLflow login (move the `champion`
alias). Now the parent's credentials are removed from the child's environment and the child's own put
in, from variables the Executor is given for that purpose:

    SCANFLOW_<KIND>_TOKEN                  -> the child's SCANFLOW_TOKEN
    SCANFLOW_<KIND>_MLFLOW_USERNAME / _PASSWORD -> the child's MLFLOW_TRACKING_USERNAME / _PASSWORD

(<KIND>: REPLICA, GATEWAY, JOB). The record key (scanflow.tracking.record_ids) never reaches a child:
the platform gives a replica its service's key instead (`replica_record_key`). Without
SCANFLOW_AUTH_TOKENS (the legacy single token) a child without credentials of its own gets the
parent's SCANFLOW_TOKEN and MLflow login, so one-token setups keep working; with it (per-component
tokens) a child without its own gets none. Pure functions; the platform
calls `child_env` for each process it spawns.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from scanflow.auth import AUTH_TOKENS_ENV
from scanflow.tracking.record_ids import (
    RECORD_KEY_ENV,
    SERVICE_RECORD_KEY_ENV,
    RecordKeyError,
    parse_key,
    service_key,
)

ChildKind = Literal["replica", "gateway", "job"]
KINDS: tuple[ChildKind, ...] = ("replica", "gateway", "job")
MLFLOW_USER, MLFLOW_PASSWORD, MLFLOW_TOKEN = "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"


def kind_vars(kind: str) -> tuple[str, str, str]:
    """(token, MLflow user, MLflow password) variable names holding a child kind's credentials."""
    k = kind.upper()
    return f"SCANFLOW_{k}_TOKEN", f"SCANFLOW_{k}_MLFLOW_USERNAME", f"SCANFLOW_{k}_MLFLOW_PASSWORD"


def _credential_names() -> set[str]:
    names = {"SCANFLOW_TOKEN", MLFLOW_USER, MLFLOW_PASSWORD, MLFLOW_TOKEN, RECORD_KEY_ENV, SERVICE_RECORD_KEY_ENV}
    for k in KINDS:
        names.update(kind_vars(k))
    return names


def child_env(parent: Mapping[str, str], kind: ChildKind) -> dict[str, str]:
    """Pure: the environment for a child of `kind`, from its parent's: every credential of the parent
    (and of the other kinds) removed, the child's own set (see the module docstring)."""
    token_var, user_var, password_var = kind_vars(kind)
    env = {k: v for k, v in parent.items() if k not in _credential_names()}
    legacy = not parent.get(AUTH_TOKENS_ENV, "").strip()
    token = parent.get(token_var) or (parent.get("SCANFLOW_TOKEN") if legacy else None)
    if token:
        env["SCANFLOW_TOKEN"] = token
    if parent.get(user_var):
        env[MLFLOW_USER] = parent[user_var]
        if parent.get(password_var):
            env[MLFLOW_PASSWORD] = parent[password_var]
    elif legacy:
        for name in (MLFLOW_USER, MLFLOW_PASSWORD, MLFLOW_TOKEN):
            if parent.get(name):
                env[name] = parent[name]
    return env


def replica_record_key(parent: Mapping[str, str], service: str) -> dict[str, str]:
    """Pure: what a replica of `service` gets of the parent's record key: its service's key (hex), or
    nothing when the parent holds none or an invalid one (its ids are then plain random ids)."""
    text = parent.get(RECORD_KEY_ENV, "").strip()
    if not text:
        return {}
    try:
        key = parse_key(text, RECORD_KEY_ENV)
    except RecordKeyError:
        return {}
    return {SERVICE_RECORD_KEY_ENV: service_key(key, service).hex()}
