"""run_job: a real child process inside a real MLflow run holding its log and outcome."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from scanflow.platform.jobrunner import is_secret, public_params, to_jsonable
from scanflow.platform.local_jobs import job_argv
from scanflow.spec import Job


def test_secret_names_are_never_params() -> None:
    assert is_secret("api_key") and is_secret("DB_PASSWORD") and is_secret("SCANFLOW_TOKEN")
    assert public_params({"epochs": 3, "client_secret": "x", "lr": 0.1}) == {"epochs": "3", "lr": "0.1"}
    assert to_jsonable(3) == {"result": 3} and to_jsonable(None) == {}


def test_job_argv_carries_no_params() -> None:
    job = Job(name="t", entrypoint="pkg.mod:fn", params={"api_key": "sk-1", "epochs": 2})
    assert job_argv("/py", job) == ["/py", "-m", "scanflow.platform.jobrunner", "pkg.mod:fn"]
    assert job_argv("/py", Job(name="t", entrypoint=["echo", "x"])) == ["echo", "x"]


@pytest.mark.integration
def test_job_params_are_not_on_the_command_line(platform, mlflow_server) -> None:  # type: ignore[no-untyped-def]
    """The running job reads its own /proc/self/cmdline (what ps shows): no param value is in it,
    yet the function received the secret (through SCANFLOW_JOB_PARAMS)."""
    job = Job(name="argv", entrypoint="plat_jobs:own_cmdline", params={"api_key": "sk-argv-secret"}, timeout_s=120)
    res = platform.run_job(job, {"epochs_marker": "marker-4711"})
    assert res.succeeded, res.message
    assert "scanflow.platform.jobrunner plat_jobs:own_cmdline" in res.outputs["cmdline"]
    assert "sk-argv-secret" not in res.outputs["cmdline"] and "marker-4711" not in res.outputs["cmdline"]
    assert "--params" not in res.outputs["cmdline"] and res.outputs["got_key"] == "True"


def _log_text(client: MlflowClient, run_id: str, tmp_path) -> str:  # type: ignore[no-untyped-def]
    arts = client.list_artifacts(run_id, "logs")
    assert len(arts) == 1
    return Path(client.download_artifacts(run_id, arts[0].path, str(tmp_path))).read_text()


@pytest.mark.integration
def test_function_job_succeeds_with_outputs_and_logs(platform, mlflow_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    job = Job(name="train-ok", entrypoint="plat_jobs:train", params={"epochs": 2}, timeout_s=120)
    res = platform.run_job(job, {"api_key": "sk-very-secret"})
    assert res.succeeded, res.message
    assert res.exit_code == 0 and res.outputs == {"accuracy": pytest.approx(0.7), "epochs": 2}
    client = MlflowClient(mlflow_server)
    run = client.get_run(res.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["scanflow.job.exit_code"] == "0"
    assert "job_duration_s" in run.data.metrics  # the same bookkeeping as a Kubernetes Job (scanflow.platform.jobruns)
    assert run.data.params == {"epochs": "2"}  # api_key never logged
    assert "sk-very-secret" not in json.dumps(run.data.tags)
    assert "training for 2 epochs" in _log_text(client, res.run_id, tmp_path)
    outputs = Path(client.download_artifacts(res.run_id, "outputs.json", str(tmp_path)))
    assert json.loads(outputs.read_text())["epochs"] == 2


@pytest.mark.integration
def test_failing_job_is_reported_with_its_traceback(platform, mlflow_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    res = platform.run_job(Job(name="boom", entrypoint="plat_jobs:explode", timeout_s=120))
    assert not res.succeeded and res.exit_code == 1
    client = MlflowClient(mlflow_server)
    assert client.get_run(res.run_id).info.status == "FAILED"
    assert "boom: the job failed on purpose" in _log_text(client, res.run_id, tmp_path)


@pytest.mark.integration
def test_timeout_kills_the_job(platform, mlflow_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    cmd = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"]
    res = platform.run_job(Job(name="too-slow", entrypoint=cmd, timeout_s=1.5, params={"db_password": "x"}))
    assert not res.succeeded and "timed out" in res.message
    assert res.duration_s is not None and res.duration_s < 30
    client = MlflowClient(mlflow_server)
    run = client.get_run(res.run_id)
    assert run.info.status == "KILLED"
    assert "db_password" not in run.data.params
    assert "started" in _log_text(client, res.run_id, tmp_path)
