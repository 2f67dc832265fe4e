"""scanflow.deploy_secrets: one credential per component, digests only in the shared tables, the env
file formats kustomize and compose read, and no overwrite of a set a cluster already holds."""

from __future__ import annotations

import itertools
import json
import stat
from collections.abc import Callable
from pathlib import Path

from scanflow import deploy_secrets as ds
from scanflow.auth import COMPONENT_SCOPES, TokenTable, token_digest
from scanflow.embedded.stack import MLFLOW_ROLES
from scanflow.tracking.mlflow_proxy import identify, parse_users


def counter_rand() -> Callable[[int], str]:
    n = itertools.count()
    return lambda size: f"{next(n):0{size * 2}x}"


def test_every_credential_is_distinct_and_the_tables_hold_digests_only() -> None:
    values = ds.generate()
    creds = {k: v for k, v in values.items() if k.endswith(("-token", "-mlflow-password"))}
    assert len(set(creds.values())) == len(creds) and all(len(v) == 64 for v in creds.values())
    for shared in (ds.AUTH_TOKENS_KEY, ds.MLFLOW_USERS_KEY):
        assert not any(v in values[shared] for v in creds.values())
    table = TokenTable.parse(values[ds.AUTH_TOKENS_KEY])
    replica = table.identify("Bearer " + values["replica-token"])
    assert replica is not None and replica.scopes == COMPONENT_SCOPES["replica"]
    assert not replica.allows("actuate") and not replica.allows("serving:admin")
    users = parse_users(values[ds.MLFLOW_USERS_KEY])
    job = identify(users, "Bearer " + values["job-mlflow-password"])
    assert job is not None and job.role == "job"
    assert {e["sha256"] for e in json.loads(values[ds.AUTH_TOKENS_KEY])} == {
        token_digest(values[ds.token_key(c.name)]) for c in ds.COMPONENTS if c.scopes}


def test_the_deployments_hold_what_the_embedded_stack_holds() -> None:
    assert {c.name: c.mlflow_role for c in ds.COMPONENTS if c.mlflow_role} == MLFLOW_ROLES
    assert {c.name: c.scopes for c in ds.COMPONENTS if c.scopes} == COMPONENT_SCOPES


def test_render_formats() -> None:
    values = ds.generate(counter_rand())
    kube = ds.render(values, "kube").splitlines()
    assert kube[0].startswith("operator-token=") and any(l.startswith("auth-tokens=[") for l in kube)
    compose = ds.render(values, "compose").splitlines()
    assert any(l.startswith("AUTH_TOKENS='[") and l.endswith("]'") for l in compose)
    assert any(l.startswith("POSTGRES_PASSWORD=") for l in compose)


def test_main_writes_private_and_never_overwrites(tmp_path: Path) -> None:
    out = tmp_path / "secrets.env"
    assert ds.main([str(out)]) == 0
    first = out.read_text()
    assert stat.S_IMODE(out.stat().st_mode) == 0o600 and "auth-tokens=" in first
    assert ds.main([str(out)]) == 0 and out.read_text() == first  # kept: the cluster holds those values


def test_dev_script_refuses_a_single_shared_token_file(tmp_path: Path) -> None:
    import os
    import shutil
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    script = tmp_path / "deploy/overlays/dev/gen-secrets.sh"
    script.parent.mkdir(parents=True)
    shutil.copy(root / "deploy/overlays/dev/gen-secrets.sh", script)
    (script.parent / "secrets.env").write_text("token=abc\npostgres-password=def\n")
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(root)}
    done = subprocess.run(["sh", str(script)], capture_output=True, text=True, env=env, check=False)
    assert done.returncode != 0 and "single shared token" in done.stderr
    (script.parent / "secrets.env").unlink()
    done = subprocess.run(["sh", str(script)], capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr
    assert "replica-token=" in (script.parent / "secrets.env").read_text()
