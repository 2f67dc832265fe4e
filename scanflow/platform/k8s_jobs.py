"""Jobs on a cluster: one batch/v1 Job per run, inside the job's MLflow run (scanflow.platform.jobruns).

The run is opened first and its id passed in the Job's env (MLFLOW_RUN_ID), so the job runner logs
into it; the params' local files are shipped through the run (the pod has another filesystem); the
Job is waited on through its conditions, and its pod logs, duration and outcome are added when it
ends. Separate from `KubernetesPlatform` (which passes itself in for its API calls and settings), as
local_jobs.py is for the local platform: a Job's lifecycle shares nothing with the services' objects.
Who calls: KubernetesPlatform.run_job.
"""

from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scanflow.platform import manifests as mf
from scanflow.platform.base import JobResult, PlatformError
from scanflow.platform.jobruns import JobRun, jobs_experiment
from scanflow.spec import Job

if TYPE_CHECKING:
    from scanflow.platform.kubernetes import KubernetesPlatform

log = logging.getLogger(__name__)


def run_k8s_job(plat: KubernetesPlatform, job: Job, params: dict[str, Any] | None = None) -> JobResult:
    """Run `job` as a batch/v1 Job in one MLflow run: the run is opened first and its id passed in
    the Job's env (MLFLOW_RUN_ID), so the job runner logs params, metrics and `outputs.json` into
    it; the pod logs, duration and outcome are added when the Job ends, and `outputs.json` is read
    back into JobResult.outputs. Waits on the Job's conditions up to timeout_s (+ grace)."""
    run_name = f"{job.name[:54]}-{uuid.uuid4().hex[:8]}"
    merged = {**job.params, **(params or {})}
    tracking = open_job_run(plat, job, run_name, merged)
    run_id = tracking.run_id if tracking else None
    files = ship_files(tracking, merged) if tracking else {}
    body = mf.batch_job(job, run_name, params=params, namespace=plat.namespace, image=plat.image,
                        workflow=plat.workflow, tracking_uri=plat.tracking_uri, run_id=run_id, files=files)
    started = time.monotonic()
    try:
        plat._call("create", "jobs", plat.batch.create_namespaced_job, plat.namespace, body)
    except PlatformError:
        if tracking:
            tracking.finish("FAILED", 0.0, log_text="<job not created>")
        raise
    deadline = started + job.timeout_s + plat.job_grace_s
    succeeded: bool | None = None
    message = ""
    while succeeded is None:
        st = plat._dict(plat._call("get", "jobs", plat.batch.read_namespaced_job, run_name, plat.namespace))
        for cond in (st.get("status") or {}).get("conditions") or []:
            if cond.get("status") != "True":
                continue
            if cond.get("type") in ("Complete", "SuccessCriteriaMet"):
                succeeded, message = True, "completed"
            elif cond.get("type") in ("Failed", "FailureTarget"):
                succeeded = False
                message = f"failed: {cond.get('reason', '')} {cond.get('message', '')}".strip()
        if succeeded is None and time.monotonic() > deadline:
            plat._call("delete", "jobs", plat.batch.delete_namespaced_job, run_name, plat.namespace,
                       propagation_policy="Background")
            succeeded, message = False, f"timed out after {job.timeout_s:.0f}s; job deleted"
        elif succeeded is None:
            time.sleep(plat.poll_interval_s)
    duration = time.monotonic() - started
    logs = job_logs(plat, run_name)
    outputs: dict[str, Any] = {}
    if tracking is None:
        note = " (no MLflow run: no tracking URI)" if not plat.tracking_uri else \
            " (logs not attached: MLflow unreachable when the Job started)"
    else:
        note = tracking.finish("FINISHED" if succeeded else "FAILED", duration, log_text=logs)
        outputs = tracking.logged_outputs()
    return JobResult(name=run_name, succeeded=succeeded, run_id=run_id, duration_s=duration,
                     message=message + note, outputs=outputs)


def open_job_run(plat: KubernetesPlatform, job: Job, run_name: str, params: dict[str, Any]) -> JobRun | None:
    """The Job's MLflow run (scanflow.platform.jobruns; experiment scanflow-jobs/<workflow>), or None
    without a tracking URI or when MLflow is unreachable (the Job still runs; its job runner then
    opens a run of its own)."""
    if not plat.tracking_uri:
        return None
    try:
        return JobRun.open(plat.tracking_uri, jobs_experiment(plat.workflow or plat.namespace), job, run_name,
                           params, tags={"scanflow.k8s_job": run_name, "scanflow.namespace": plat.namespace})
    except Exception as exc:  # noqa: BLE001  # tracking down must not stop the job
        log.warning("no MLflow run for job %s: %s", run_name, type(exc).__name__)
        return None


def ship_files(tracking: JobRun, params: dict[str, Any]) -> dict[str, str]:
    """Log the params' local files into the Job's run: its pod has another filesystem (the
    Executor's plan data under SCANFLOW_HOME is not there). {param: artifact path}; a file that
    cannot be logged is left out (the job then names the missing path)."""
    from scanflow.platform.jobrunner import artifact_path, shippable_files

    out: dict[str, str] = {}
    for name, path in shippable_files(params).items():
        dest = artifact_path(name, path)
        try:
            tracking.client.log_artifact(tracking.run_id, path, str(Path(dest).parent))
            out[name] = dest
        except Exception as exc:  # noqa: BLE001  # MLflow down: the job still runs, and says what is missing
            log.warning("could not ship %s to the job's run: %s", name, type(exc).__name__)
    return out


def job_logs(plat: KubernetesPlatform, run_name: str, limit_bytes: int = 1_000_000) -> str:
    pods = plat._call("list", "pods", plat.core.list_namespaced_pod, plat.namespace,
                      label_selector=f"batch.kubernetes.io/job-name={run_name}")
    chunks = []
    for pod in plat._dict(pods).get("items") or []:
        name = pod["metadata"]["name"]
        try:
            text = plat._call("get", "pods/log", plat.core.read_namespaced_pod_log, name, plat.namespace,
                              container=mf.JOB_CONTAINER, limit_bytes=limit_bytes)
        except PlatformError as exc:
            text = f"<logs unavailable: {exc}>"
        chunks.append(f"==> pod {name} <==\n{text}")
    return "\n".join(chunks)
