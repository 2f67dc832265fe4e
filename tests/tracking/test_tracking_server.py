"""The embedded MLflow server: Host-header rule, reuse by ensure_tracking, health."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest

from scanflow.platform.processes import free_port
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


def test_ensure_tracking_reuses_a_running_server(mlflow_server: str, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "SCANFLOW_REPLICA_MLFLOW_USERNAME",
                 "SCANFLOW_REPLICA_MLFLOW_PASSWORD", "SCANFLOW_JOB_MLFLOW_USERNAME", "SCANFLOW_JOB_MLFLOW_PASSWORD"):
        monkeypatch.delenv(name, raising=False)  # ensure_tracking logs this process in: undone afterwards
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


@pytest.mark.slow
def test_cli_up_serves_until_sigterm_and_leaves_no_process(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "scanflow.cli", "mlflow", "up", "--home", str(tmp_path), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while not ((tmp_path / "server.json").exists() and is_healthy(url)):  # ready = both
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            assert time.monotonic() < deadline, "scanflow mlflow up did not become healthy"
            time.sleep(0.1)
        assert json.loads((tmp_path / "server.json").read_text())["url"] == url
        assert (tmp_path / "mlflow.db").exists() and (tmp_path / "mlflow.log").exists()
        # behind logins: generated into a file only its owner reads, and said where
        logins = tmp_path / "logins.json"
        assert stat.S_IMODE(logins.stat().st_mode) == 0o600
        operator = json.loads(logins.read_text())["operator"]["password"]
        api = url + "/api/2.0/mlflow/experiments/create"
        assert httpx.post(api, json={"name": "anonymous"}, timeout=30).status_code == 401
        assert httpx.post(api, json={"name": "operator"}, auth=("operator", operator), timeout=30).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert proc.stdout is not None and f"logins: {logins}" in proc.stdout.read().decode()
        assert not is_healthy(url, timeout_s=1)  # the server (another process group) went with it
    finally:
        if proc.poll() is None:  # the CLI stops its server on SIGTERM; SIGKILL only if it hangs
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if is_healthy(url, timeout_s=1):  # only then is the recorded pid still our server
            _kill_recorded_server(tmp_path)


def _kill_recorded_server(home: Path) -> None:
    """If the test failed half-way, the server (its own process group) must not outlive it."""
    for key in ("pid", "proxy_pid"):
        try:
            pid = int(json.loads((home / "server.json").read_text())[key])
            os.killpg(pid, signal.SIGKILL)
        except (OSError, ValueError, KeyError, TypeError):
            pass
