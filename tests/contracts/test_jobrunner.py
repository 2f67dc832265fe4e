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


def test_a_param_naming_a_file_of_the_callers_filesystem_is_fetched_from_the_run(tmp_path: Path,
                                                                                 mlflow_server: str) -> None:
    """A Kubernetes Job's pod cannot open the Executor's plan files: the platform ships them into the
    job's run (SCANFLOW_JOB_FILES) and the runner calls the function with a local copy, while the
    params logged stay the caller's paths (the Executor's retry lookup searches by them)."""
    import mlflow

    from scanflow.platform.jobrunner import artifact_path, shippable_files

    plan = tmp_path / "executor-home" / "plan-4-train.npz"
    plan.parent.mkdir()
    plan.write_text("critical points")
    params = {"points_path": str(plan)}
    assert shippable_files({**params, "api_token": str(plan), "n": 3, "rel": "plan.npz"}) == params
    client = mlflow.MlflowClient(mlflow_server)
    exp = client.create_experiment(f"ship-{tmp_path.name}")
    run = client.create_run(exp)
    dest = artifact_path("points_path", str(plan))
    client.log_artifact(run.info.run_id, str(plan), str(Path(dest).parent))
    moved = tmp_path / "executor-home-gone"
    plan.parent.rename(moved)  # the job runs where that path does not exist
    out = tmp_path / "out.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SCANFLOW_JOB_PARAMS": json.dumps(params),
           "SCANFLOW_JOB_FILES": json.dumps({"points_path": dest}), "MLFLOW_RUN_ID": run.info.run_id,
           "SCANFLOW_JOB_OUTPUT": str(out), "MLFLOW_TRACKING_URI": mlflow_server}
    done = subprocess.run([sys.executable, "-m", "scanflow.platform.jobrunner", "tests.contracts.jobfns:read"],
                          check=False, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(out.read_text())
    assert got["text"] == "critical points" and got["path"] != str(plan)
    assert client.get_run(run.info.run_id).data.params == {"points_path": str(plan)}


def test_localize_keeps_a_file_that_exists_here(tmp_path: Path) -> None:
    from scanflow.platform.jobrunner import localize

    here = tmp_path / "a.npz"
    here.write_text("x")
    fetched: list[str] = []
    got = localize({"a": str(here), "b": "/nowhere/b.npz", "c": 1}, {"a": "inputs/a/a.npz", "b": "inputs/b/b.npz"},
                   lambda art: fetched.append(art) or f"/local/{art}")
    assert got == {"a": str(here), "b": "/local/inputs/b/b.npz", "c": 1} and fetched == ["inputs/b/b.npz"]
