"""One job runner for both platforms: the Kubernetes form (params by env, old `jobrun` entry) as a real
process, the local form (`--params`, MLFLOW_RUN_ID) is covered by tests/platform_local/test_jobs.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(module: str, entry: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    full.pop("MLFLOW_RUN_ID", None)
    return subprocess.run([sys.executable, "-m", module, entry], check=False, env=full, cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_k8s_form_reads_params_from_env_and_logs_a_run(tmp_path: Path, mlflow_server: str) -> None:
    """As a Kubernetes Job runs it: params in SCANFLOW_JOB_PARAMS, own run named after the job,
    secrets never logged as params."""
    out = tmp_path / "out.json"
    env = {"SCANFLOW_JOB_PARAMS": json.dumps({"a": 2, "b": 3, "api_token": "s3cret"}),
           "SCANFLOW_JOB_NAME": "adder", "SCANFLOW_JOB_OUTPUT": str(out),
           "MLFLOW_TRACKING_URI": mlflow_server, "MLFLOW_EXPERIMENT_NAME": f"jobs-test-{tmp_path.name}"}
    done = _run("scanflow.platform.jobrunner", "tests.contracts.jobfns:add", env, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(out.read_text()) == {"sum": 5}
    import mlflow

    client = mlflow.MlflowClient(env["MLFLOW_TRACKING_URI"])
    runs = client.search_runs([client.get_experiment_by_name(env["MLFLOW_EXPERIMENT_NAME"]).experiment_id])
    assert [(r.info.run_name, r.data.params) for r in runs] == [("adder", {"a": "2", "b": "3"})]


def test_old_jobrun_entry_still_works_and_bad_env_params_exit_2(tmp_path: Path) -> None:
    done = _run("scanflow.platform.jobrun", "tests.contracts.jobfns:add", {"SCANFLOW_JOB_PARAMS": "[1, 2]"}, tmp_path)
    assert done.returncode == 2 and "SCANFLOW_JOB_PARAMS must be a JSON object" in done.stderr
    done = _run("scanflow.platform.jobrun", "tests.contracts.jobfns:nope", {"SCANFLOW_JOB_PARAMS": "{}"}, tmp_path)
    assert done.returncode == 2 and "has no function 'nope'" in done.stderr
