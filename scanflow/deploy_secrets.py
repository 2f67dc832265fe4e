"""Which credential each component of a deployment (compose, Kubernetes) holds, and the generator of
the Secret that carries them.

Why one table: the embedded stack mints these in memory, but compose and Kubernetes read them from a
Secret (an env file). The manifests (deploy/, scanflow.platform.manifests), docker-compose.yml, the
generator and the tests all name the same keys from here, so no component can silently fall back to a
shared token. Each component has its own Scanflow token (scopes: scanflow.auth.COMPONENT_SCOPES) and/or
its own MLflow login (roles: scanflow.tracking.mlflow_proxy). Who holds none: the gateway (it only
forwards to replicas' open /predict and checks callers' tokens by digest).

Secret keys (Kubernetes; compose uses the same names upper-cased, `-` -> `_`: `tracker-token` ->
`TRACKER_TOKEN`):
- `<component>-token`: its Scanflow token (sent as `Authorization: Bearer`);
- `<component>-mlflow-password`: its MLflow password (login name = the component's name);
- `auth-tokens`: SCANFLOW_AUTH_TOKENS, the digests and scopes every server accepts (no token in it);
- `mlflow-users`: SCANFLOW_MLFLOW_USERS, the MLflow proxy's logins (digests and roles only);
- `postgres-password`: the PostgreSQL superuser's (MLflow's backend store);
- `<agent>-store-password`: each agent's own database role (`agent_<agent>`, owner of `agents_<agent>`
  only: deploy/base/postgres-init.sql), for its durable store.

`python -m scanflow.deploy_secrets [--format kube|compose] FILE` writes a fresh set (mode 0600) and
refuses to overwrite a file: the cluster already has those values.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from scanflow.auth import COMPONENT_SCOPES, TokenTable
from scanflow.tracking.mlflow_proxy import users_json
from scanflow.tracking.mlflow_routes import Role

AUTH_TOKENS_KEY = "auth-tokens"
MLFLOW_USERS_KEY = "mlflow-users"
POSTGRES_KEY = "postgres-password"
STORE_AGENTS = ("tracker", "checker", "planner", "executor")  # each has a database role of its own
# binds prediction records to their service (scanflow.tracking.record_ids): the Tracker and the Executor,
# which derives each service's key for the replicas it starts (compose; on Kubernetes replicas are
# Deployments the Executor does not hand keys to yet, so there the Tracker gets none and binds nothing)
RECORD_KEY_KEY = "record-key"
Format = Literal["kube", "compose"]


@dataclass(frozen=True)
class Component:
    """A component's credentials: Scanflow token scopes (empty: no token) and MLflow role (None: no login)."""

    name: str
    scopes: frozenset[str]
    mlflow_role: Role | None


# Jobs (training) and the bootstrap call no agent: an MLflow login only. A Job may not move the
# champion (role `job`); the bootstrap registers the first champion (admin, as in the embedded stack).
COMPONENTS: tuple[Component, ...] = (
    Component("operator", COMPONENT_SCOPES["operator"], "admin"),
    *(Component(a, COMPONENT_SCOPES[a], "writer") for a in ("tracker", "checker", "planner")),
    Component("executor", COMPONENT_SCOPES["executor"], "executor"),  # the only one that moves `champion`
    Component("replica", COMPONENT_SCOPES["replica"], "reader"),
    Component("feedback", COMPONENT_SCOPES["feedback"], None),
    Component("job", frozenset(), "job"),
    Component("bootstrap", frozenset(), "admin"),
)
BY_NAME = {c.name: c for c in COMPONENTS}


def token_key(component: str) -> str:
    return f"{component}-token"


def mlflow_password_key(component: str) -> str:
    return f"{component}-mlflow-password"


def store_password_key(agent: str) -> str:
    return f"{agent}-store-password"


def env_name(key: str) -> str:
    """The compose (.env) variable of a Secret key: `tracker-token` -> `TRACKER_TOKEN`."""
    return key.upper().replace("-", "_")


def generate(rand: Callable[[int], str] = secrets.token_hex) -> dict[str, str]:
    """Pure given `rand`: a fresh credential set, Secret key -> value. Tokens and passwords are
    independent random values (256 bits); the two tables hold digests only."""
    out: dict[str, str] = {}
    tokens: dict[str, tuple[str, frozenset[str]]] = {}
    logins: dict[str, tuple[str, Role]] = {}
    for c in COMPONENTS:
        if c.scopes:
            tokens[c.name] = (rand(32), c.scopes)
            out[token_key(c.name)] = tokens[c.name][0]
        if c.mlflow_role is not None:
            logins[c.name] = (rand(32), c.mlflow_role)
            out[mlflow_password_key(c.name)] = logins[c.name][0]
    out[AUTH_TOKENS_KEY] = TokenTable.of(tokens).to_json().replace(" ", "")
    out[MLFLOW_USERS_KEY] = users_json(logins).replace(" ", "")
    out[POSTGRES_KEY] = rand(24)
    for agent in STORE_AGENTS:
        out[store_password_key(agent)] = rand(24)
    out[RECORD_KEY_KEY] = rand(32)
    return out


def render(values: dict[str, str], fmt: Format) -> str:
    """An env file: `key=value` lines (kustomize secretGenerator / `kubectl create secret
    --from-env-file`), or compose's .env (upper-case names; JSON values single-quoted, taken literally)."""
    lines = []
    for key, value in values.items():
        if fmt == "kube":
            lines.append(f"{key}={value}")
        else:
            lines.append(f"{env_name(key)}='{value}'" if value.startswith("[") else f"{env_name(key)}={value}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scanflow.deploy_secrets", description=__doc__.splitlines()[0])
    p.add_argument("out", help="the env file to write (refused when it exists)")
    p.add_argument("--format", choices=["kube", "compose"], default="kube")
    args = p.parse_args(argv)
    try:
        fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        print(f"{args.out} exists; keeping it (delete it to make a new set)", file=sys.stderr)
        return 0
    with os.fdopen(fd, "w") as f:
        f.write(render(generate(), args.format))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
