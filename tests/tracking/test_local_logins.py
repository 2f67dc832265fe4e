"""MLflow started outside the embedded stack runs behind logins too (issue #15): `ensure_tracking`
(`scanflow deploy --platform local`) and the demo's fallback MLflow (`scanflow mlflow up`: see
test_tracking_server.py), with the logins in a 0600 file; MLflow without logins binds only loopback.
Real MLflow servers on loopback."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import httpx
import pytest

from scanflow.credentials import MLFLOW_PASSWORD, MLFLOW_USER, kind_vars
from scanflow.settings import Settings
from scanflow.tracking import server as server_mod
from scanflow.tracking.logins import LoginsFileError, client_env, load_or_create, logins_path
from scanflow.tracking.server import MlflowServer, ensure_tracking, is_loopback

CREATE = "/api/2.0/mlflow/experiments/create"
LOGIN_VARS = (MLFLOW_USER, MLFLOW_PASSWORD, *kind_vars("replica")[1:], *kind_vars("job")[1:])


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the code under test puts in os.environ is undone afterwards."""
    for name in LOGIN_VARS:
        monkeypatch.delenv(name, raising=False)


def test_logins_are_made_once_readable_only_by_their_owner(tmp_path: Path) -> None:
    first = load_or_create(tmp_path)
    path = logins_path(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert {n: r for n, (_, r) in first.items()} == {"operator": "admin", "executor": "executor", "agent": "writer", "job": "job",
                                                      "replica": "reader"}
    assert len({p for p, _ in first.values()}) == 5 and all(len(p) >= 24 for p, _ in first.values())
    assert load_or_create(tmp_path) == first  # kept: a reused server needs the same logins
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind
    env = client_env(first)
    assert env[MLFLOW_USER] == "operator" and env[MLFLOW_PASSWORD] == first["operator"][0]
    assert env["SCANFLOW_REPLICA_MLFLOW_USERNAME"] == "replica" and env["SCANFLOW_JOB_MLFLOW_USERNAME"] == "job"
    path.chmod(0o644)
    with pytest.raises(LoginsFileError, match="readable by others"):
        load_or_create(tmp_path)
    path.chmod(0o600)
    path.write_text('{"agent": {"password": "x", "role": "writer"}}')
    with pytest.raises(LoginsFileError, match="no 'operator'"):
        load_or_create(tmp_path)


def test_mlflow_without_logins_binds_only_loopback(tmp_path: Path) -> None:
    for host in ("127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"):
        assert is_loopback(host), host
        MlflowServer(tmp_path, port=5999, host=host)  # accepted (nothing starts)
    for host in ("0.0.0.0", "", "::", "10.0.0.5", "mlflow.example"):
        assert not is_loopback(host), host
        with pytest.raises(ValueError, match="without logins"):
            MlflowServer(tmp_path, port=5999, host=host)
    MlflowServer(tmp_path, port=5999, host="0.0.0.0", users={"operator": ("pw", "admin")})  # behind logins: fine


@pytest.mark.integration
@pytest.mark.slow
def test_ensure_tracking_starts_mlflow_behind_logins(tmp_path: Path, clean_env: None) -> None:
    home = (tmp_path / "mlflow").resolve()
    try:
        url = ensure_tracking(Settings(home=tmp_path))
        logins = json.loads(logins_path(home).read_text())
        assert stat.S_IMODE(logins_path(home).stat().st_mode) == 0o600
        assert httpx.post(url + CREATE, json={"name": "anonymous"}, timeout=30).status_code == 401
        # this process is the operator now; the platform's children get their own logins
        assert os.environ[MLFLOW_USER] == "operator" and os.environ[MLFLOW_PASSWORD] == logins["operator"]["password"]
        assert os.environ["SCANFLOW_REPLICA_MLFLOW_PASSWORD"] == logins["replica"]["password"]
        auth = (os.environ[MLFLOW_USER], os.environ[MLFLOW_PASSWORD])
        assert httpx.post(url + CREATE, json={"name": "by-operator"}, auth=auth, timeout=30).status_code == 200
        replica = ("replica", logins["replica"]["password"])
        assert httpx.post(url + CREATE, json={"name": "by-replica"}, auth=replica, timeout=30).status_code == 403
        assert ensure_tracking(Settings(home=tmp_path)) == url  # reused, same logins
    finally:
        owned = server_mod._owned.pop(home, None)
        if owned is not None:
            owned.stop()


@pytest.mark.integration
@pytest.mark.slow
def test_the_demos_fallback_mlflow_is_behind_logins(tmp_path: Path, clean_env: None,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from scanflow.demo import runner

    ran: list[dict[str, str]] = []

    def bootstrap(argv: list[str], env: dict[str, str], **kw: Any) -> None:  # the bootstrap trains: not here
        ran.append(env)

    monkeypatch.setattr(runner.subprocess, "run", bootstrap)
    with runner._bare_mlflow(tmp_path, quick=True) as url:
        password = json.loads(logins_path(tmp_path / "mlflow").read_text())["operator"]["password"]
        assert httpx.post(url + CREATE, json={"name": "anonymous"}, timeout=30).status_code == 401
        assert httpx.post(url + CREATE, json={"name": "demo"}, auth=("operator", password), timeout=30).status_code == 200
        assert ran and ran[0][MLFLOW_USER] == "operator" and ran[0][MLFLOW_PASSWORD] == password
        assert os.environ[MLFLOW_PASSWORD] == password  # S2/S3 read MLflow from this process
    assert MLFLOW_PASSWORD not in os.environ  # restored when the server stops
