"""One secret filter for every platform (scanflow.secrets): the names the two old filters disagreed on
(private_key, aws_access_key_id...) are hidden from a Job's env literal, from MLflow params and from
the job runner's logged params alike."""

from __future__ import annotations

import json
import threading
import time

import pytest

from scanflow.platform import jobrunner
from scanflow.platform import manifests as mf
from scanflow.secrets import is_secret, mlflow_params, public_params
from scanflow.spec import Job

SECRETS = {"private_key": "pk-1", "aws_access_key_id": "AKIA1", "aws_secret_access_key": "sk-1",
           "api_token": "t-1", "DB_PASSWORD": "pw-1", "db_passwd": "pw-2", "gcp_credentials": "c-1",
           "auth_header": "Bearer x"}
PUBLIC = {"epochs": 3, "lr": 0.01, "model_name": "digits"}


@pytest.mark.parametrize("name", sorted(SECRETS))
def test_secret_names(name: str) -> None:
    assert is_secret(name) and jobrunner.is_secret(name)


def test_every_filter_keeps_the_same_public_params() -> None:
    params = {**SECRETS, **PUBLIC}
    assert public_params(params) == PUBLIC
    assert mf.public_params(params) == PUBLIC
    assert mlflow_params(params) == jobrunner.public_params(params) == {k: str(v) for k, v in PUBLIC.items()}


def test_job_env_literal_holds_no_secret_param() -> None:
    job = Job(name="train", entrypoint="pkg.mod:fn", params={"epochs": 3, "private_key": "pk-1"})
    body = mf.batch_job(job, "train-1", params={"aws_access_key_id": "AKIA1", "lr": 0.01})
    env = body["spec"]["template"]["spec"]["containers"][0]["env"]
    params = json.loads(next(e["value"] for e in env if e["name"] == "SCANFLOW_JOB_PARAMS"))
    assert params == {"epochs": 3, "lr": 0.01}
    text = json.dumps(body)
    assert "pk-1" not in text and "AKIA1" not in text


def test_kubernetes_run_job_sends_no_secret_param(kmock_server, make_platform) -> None:  # type: ignore[no-untyped-def]
    plat = make_platform()

    def complete() -> None:  # play the job controller: mark the created Job complete, give it a pod
        end = time.monotonic() + 10
        while time.monotonic() < end:
            jobs = plat.batch.list_namespaced_job("scanflow").items
            if jobs:
                name = jobs[0].metadata.name
                plat.core.create_namespaced_pod("scanflow", {
                    "apiVersion": "v1", "kind": "Pod", "metadata": {
                        "name": f"{name}-x", "namespace": "scanflow",
                        "labels": {"batch.kubernetes.io/job-name": name}},
                    "spec": {"containers": [{"name": "job", "image": "x"}]}})
                cond = {"type": "Complete", "status": "True", "reason": "Done"}
                plat.batch.patch_namespaced_job_status(name, "scanflow", {"status": {"conditions": [cond]}})
                return
            time.sleep(0.02)

    helper = threading.Thread(target=complete, daemon=True)
    helper.start()
    result = plat.run_job(Job(name="train", entrypoint="pkg.mod:fn", params={"private_key": "pk-1"}),
                 {**SECRETS, "lr": 0.01})
    helper.join(10)
    assert result.succeeded, result.message
    create = next(r for r in kmock_server.requests() if r.method.value == "POST" and r.url.path.endswith("/jobs"))
    env = create.data["spec"]["template"]["spec"]["containers"][0]["env"]
    assert json.loads(next(e["value"] for e in env if e["name"] == "SCANFLOW_JOB_PARAMS")) == {"lr": 0.01}
    for value in SECRETS.values():
        assert value not in create.text
