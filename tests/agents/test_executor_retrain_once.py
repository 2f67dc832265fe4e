"""The Executor trains once per plan: a `retrain` retried after a crash reuses the finished training run
of its plan (tagged, or found by the plan's training-data param) and the version it registered; an
unfinished run (cut with the Executor) is trained again. Real MLflow server, real job processes."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from scanflow.platform.local import LocalPlatform
from scanflow.spec import Job
from scanflow.standard.retraining import PATH_PARAM, PLAN_TAG, PlanRun, plan_runs, reusable_run, train_once

pytestmark = pytest.mark.timeout(300)


def test_reusable_run_takes_the_newest_finished_run_with_a_version() -> None:
    runs = [PlanRun("a", "FINISHED", 1, "3"), PlanRun("b", "RUNNING", 5, "4"), PlanRun("c", "FINISHED", 3, "5"),
            PlanRun("d", "FINISHED", 9, None), PlanRun("e", "FAILED", 10, "6")]
    assert reusable_run(runs) == PlanRun("c", "FINISHED", 3, "5")
    assert reusable_run([PlanRun("b", "RUNNING", 5, "4"), PlanRun("d", "FINISHED", 9, None)]) is None
    assert reusable_run([]) is None


def _versions(client, name: str) -> list[str]:  # type: ignore[no-untyped-def]
    return sorted(v.version for v in client.search_model_versions(f"name = '{name}'"))


def test_a_retried_retrain_reuses_the_finished_run(mlflow_server: str, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_server)
    name = f"idem-{uuid.uuid4().hex[:8]}"
    job = Job(name="train", entrypoint="tests.agents.retrain_jobs:register", params={"model_name": name})
    data = tmp_path / "plan-7-train.npz"
    data.write_bytes(b"x" * 10)
    params = {PATH_PARAM: str(data), "alias": "challenger"}
    key = str(tmp_path / "plan-7")
    with LocalPlatform(tmp_path / "platform", mlflow_server, experiment=f"jobs-{name}") as plat:
        v1, run1, out1, reused1 = train_once(plat, job, params, key, "execute-retrain:7:0", mlflow_server, name)
        assert not reused1 and out1["version"] == v1 and _versions(client, name) == [v1]
        assert client.get_run(run1).data.tags[PLAN_TAG] == key
        # the Executor crashed after the job: the retry finds the run and its version, trains nothing
        v2, run2, out2, reused2 = train_once(plat, job, params, key, "execute-retrain:7:0", mlflow_server, name)
        assert (v2, run2, reused2) == (v1, run1, True) and out2["accuracy_clean"] == pytest.approx(0.9)
        assert _versions(client, name) == [v1]
        # another plan trains its own model
        other = {**params, PATH_PARAM: str(tmp_path / "plan-8-train.npz")}
        (tmp_path / "plan-8-train.npz").write_bytes(b"y")
        v3, _r, _o, reused3 = train_once(plat, job, other, str(tmp_path / "plan-8"), None, mlflow_server, name)
        assert not reused3 and v3 != v1 and len(_versions(client, name)) == 2


def test_crash_before_the_tag_and_cut_runs(mlflow_server: str, tmp_path: Path) -> None:
    """A finished run of the plan that was never tagged (crash right after the job) is found by its
    training-data param; a run left RUNNING (its job cut with the Executor) is not reused."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_server)
    name = f"idem-{uuid.uuid4().hex[:8]}"
    exp = client.create_experiment(f"jobs-{name}")
    data = str(tmp_path / "plan-3-train.npz")
    (tmp_path / "plan-3-train.npz").write_bytes(b"z")
    client.create_registered_model(name)
    cut = client.create_run(exp)  # a job killed mid-way: registered a version, never finished
    client.log_param(cut.info.run_id, PATH_PARAM, data)
    client.create_model_version(name, f"runs:/{cut.info.run_id}/model", run_id=cut.info.run_id)
    runs = plan_runs(client, name, str(tmp_path / "plan-3"), data)
    assert [(r.run_id, r.status) for r in runs] == [(cut.info.run_id, "RUNNING")]
    assert reusable_run(runs) is None  # trained again
    done = client.create_run(exp)  # the job finished, the Executor died before tagging it
    client.log_param(done.info.run_id, PATH_PARAM, data)
    mv = client.create_model_version(name, f"runs:/{done.info.run_id}/model", run_id=done.info.run_id)
    client.set_terminated(done.info.run_id, "FINISHED")
    job = Job(name="train", entrypoint="tests.agents.retrain_jobs:register", params={"model_name": name})
    with LocalPlatform(tmp_path / "platform", mlflow_server, experiment=f"jobs-{name}") as plat:
        v, run_id, _out, reused = train_once(plat, job, {PATH_PARAM: data}, str(tmp_path / "plan-3"), None,
                                             mlflow_server, name)
    assert (v, run_id, reused) == (str(mv.version), done.info.run_id, True)
    assert len(_versions(client, name)) == 2  # nothing new registered


def test_a_failed_job_is_a_permanent_error_and_is_not_reused(mlflow_server: str, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    from scanflow.agent import PermanentError

    name = f"idem-{uuid.uuid4().hex[:8]}"
    job = Job(name="train", entrypoint="tests.agents.retrain_jobs:register", params={"model_name": name})
    (tmp_path / "p.npz").write_bytes(b"z")
    params = {PATH_PARAM: str(tmp_path / "p.npz")}
    monkeypatch.setenv("IDEM_FAIL", "1")  # the job registers a version, then fails
    with (LocalPlatform(tmp_path / "platform", mlflow_server, experiment=f"jobs-{name}") as plat,
          pytest.raises(PermanentError, match="training job failed")):
        train_once(plat, job, params, str(tmp_path / "p"), None, mlflow_server, name)
    runs = plan_runs(MlflowClient(mlflow_server), name, str(tmp_path / "p"), str(tmp_path / "p.npz"))
    assert [r.status for r in runs] == ["FAILED"] and reusable_run(runs) is None
