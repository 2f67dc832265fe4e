"""The embedded MLflow server: Host-header rule, reuse by ensure_tracking, health."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlparse

import httpx

from scanflow.settings import Settings
from scanflow.tracking.server import MlflowServer, allowed_hosts, ensure_tracking, is_healthy


def test_allowed_hosts_lists_loopback_bind_host_and_extras() -> None:
    hosts = allowed_hosts("0.0.0.0", ["mlflow", "mlflow.scanflow.svc"])
    for want in ("localhost:*", "127.0.0.1", "mlflow", "mlflow:*", "mlflow.scanflow.svc:*", "10.*"):
        assert want in hosts
    assert "0.0.0.0" not in hosts and "*" not in hosts
    assert len(hosts) == len(set(hosts))


def test_server_refuses_foreign_host_header(mlflow_server: str) -> None:
    api = f"{mlflow_server}/api/2.0/mlflow/experiments/search?max_results=1"
    port = urlparse(mlflow_server).port
    assert httpx.get(api, headers={"Host": f"localhost:{port}"}, timeout=10).status_code == 200
    assert httpx.get(api, headers={"Host": "attacker.example"}, timeout=10).status_code == 403


def test_ensure_tracking_prefers_configured_uri(tmp_path: Path) -> None:
    s = Settings(home=tmp_path, tracking_uri="http://mlflow.example:5000")
    assert ensure_tracking(s) == "http://mlflow.example:5000"
    assert not (tmp_path / "mlflow").exists()  # nothing started


def test_ensure_tracking_reuses_a_running_server(mlflow_server: str, tmp_path: Path) -> None:
    home = tmp_path / "mlflow"
    home.mkdir()
    (home / "server.json").write_text(json.dumps({"url": mlflow_server, "pid": 0}))
    assert ensure_tracking(Settings(home=tmp_path)) == mlflow_server
    assert is_healthy(mlflow_server)


def test_command_is_lean_and_has_no_secrets(tmp_path: Path) -> None:
    cmd = MlflowServer(tmp_path, port=5999).command()
    joined = " ".join(cmd)
    assert "--workers 1" in joined and "--serve-artifacts" in joined and "--port 5999" in joined
    assert f"sqlite:///{tmp_path.resolve()}/mlflow.db" in joined
