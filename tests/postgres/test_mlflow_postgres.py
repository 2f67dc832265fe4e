"""MLflow's backend on a real PostgreSQL server, started the way deploy/base/mlflow.yaml and
docker-compose.yml start it: the backend URI in MLFLOW_BACKEND_STORE_URI (never in argv)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from scanflow.platform.processes import free_port

pytestmark = [pytest.mark.integration, pytest.mark.e2e]  # starts mlflow server: ~1.5 min on a busy 2-core box
START_S = 240.0  # first start creates MLflow's schema (dozens of migrations) on a loaded 2-core box


def test_mlflow_server_runs_on_postgresql_with_the_uri_in_its_environment(pg_database: str, tmp_path: Path) -> None:
    port = free_port()
    # the driver named as the manifests name it: SQLAlchemy 2.1 maps a bare postgresql:// to psycopg 3,
    # which the image does not install
    uri = pg_database
    assert uri.startswith("postgresql+psycopg2://")
    argv = [sys.executable, "-m", "mlflow", "server", "--host=127.0.0.1", f"--port={port}", "--workers=1",
            f"--artifacts-destination={tmp_path / 'artifacts'}", "--serve-artifacts"]
    assert not any("postgresql" in a for a in argv)
    env = {**os.environ, "MLFLOW_BACKEND_STORE_URI": uri, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    log = open(tmp_path / "mlflow.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + START_S
        while True:
            assert proc.poll() is None, (tmp_path / "mlflow.log").read_text()[-3000:]
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "mlflow did not answer /health"
            time.sleep(0.5)
        from mlflow.tracking import MlflowClient

        client = MlflowClient(url)
        exp = client.create_experiment("pg-check")
        run = client.create_run(exp)
        client.log_metric(run.info.run_id, "accuracy", 0.9)
        client.create_registered_model("pg-model")
        assert client.get_run(run.info.run_id).data.metrics["accuracy"] == 0.9
        assert client.get_registered_model("pg-model").name == "pg-model"
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    # the data is in PostgreSQL, not in a local file
    import sqlalchemy as sa

    engine = sa.create_engine(pg_database)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM experiments WHERE name = 'pg-check'")).scalar() == 1
    engine.dispose()
