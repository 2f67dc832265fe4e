"""A job's MLflow run, kept the same way on every platform.

The platform opens the run before the job starts and passes its id in the job's environment
(MLFLOW_RUN_ID), so the job runner logs the job's params, metrics and `outputs.json` into it; when the
job ends the platform adds what only it knows: the job's log, its duration (`job_duration_s`), its exit
code where it has one, and the outcome (FINISHED, FAILED, KILLED). One place, so a run looks the same in
MLflow whether the job ran as a local process or as a Kubernetes Job.
"""

from __future__ import annotations

import json
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from scanflow.secrets import mlflow_params
from scanflow.spec import Job

log = logging.getLogger(__name__)

DURATION_METRIC = "job_duration_s"
EXIT_CODE_TAG = "scanflow.job.exit_code"
Outcome = Literal["FINISHED", "FAILED", "KILLED"]
JOBS_EXPERIMENT = "scanflow-jobs"


def jobs_experiment(workflow: str | None = None) -> str:
    """The MLflow experiment of a workflow's job runs, the same on every platform: `scanflow-jobs/<workflow>`
    (`scanflow-jobs` for a platform used without a workflow). One name, so a team finds its training runs
    in the same place whether they ran as local processes or as Kubernetes Jobs."""
    return f"{JOBS_EXPERIMENT}/{workflow}" if workflow else JOBS_EXPERIMENT


@dataclass(frozen=True)
class JobRun:
    """An open MLflow run of one job."""

    client: Any  # mlflow.tracking.MlflowClient
    run_id: str
    experiment_id: str
    name: str

    @classmethod
    def open(cls, tracking_uri: str, experiment: str, job: Job, run_name: str, params: dict[str, Any],
             tags: dict[str, str] | None = None) -> JobRun:
        """Create the run in `experiment` (tagged for MLflow's model-training view). A command job's
        public params are logged here (a 'module:function' job's runner logs its own). MLflow errors
        propagate: the caller decides whether a job may run without its run."""
        from mlflow.tracking import MlflowClient

        from scanflow.tracking.registry import ensure_experiment

        client = MlflowClient(tracking_uri)
        exp_id = ensure_experiment(experiment, client=client)
        run = client.create_run(exp_id, run_name=run_name, tags={"scanflow.job": job.name, **(tags or {})})
        if not isinstance(job.entrypoint, str):
            for key, value in mlflow_params(params).items():
                client.log_param(run.info.run_id, key, value)
        return cls(client, run.info.run_id, exp_id, run_name)

    def finish(self, outcome: Outcome, duration_s: float, *, log_file: Path | None = None, log_text: str = "",
               exit_code: int | None = None) -> str:
        """Add the log (a file, or text), the duration, the exit code and the outcome; end the run. Never
        raises, so a job's outcome is not lost when tracking is down: '' or a note for the job's message."""
        try:
            self.client.log_metric(self.run_id, DURATION_METRIC, duration_s)
            if exit_code is not None:
                self.client.set_tag(self.run_id, EXIT_CODE_TAG, str(exit_code))
            if log_file is not None:
                self.client.log_artifact(self.run_id, str(log_file), "logs")
            else:
                self.client.log_text(self.run_id, log_text or "<no log>", f"logs/{self.name}.log")
            self.client.set_terminated(self.run_id, outcome)
        except Exception as exc:  # noqa: BLE001  # the job's outcome must not be lost because tracking is down
            log.warning("could not complete job %s's MLflow run: %s", self.name, type(exc).__name__)
            return f" (MLflow run not completed: {type(exc).__name__})"
        return ""

    def logged_outputs(self) -> dict[str, Any]:
        """The `outputs.json` the job runner logged in the run ({} when there is none: a command job, a
        failed function, or MLflow unreachable)."""
        try:
            if not any(a.path == "outputs.json" for a in self.client.list_artifacts(self.run_id)):
                return {}
            with tempfile.TemporaryDirectory() as tmp:
                loaded = json.loads(Path(self.client.download_artifacts(self.run_id, "outputs.json", tmp)).read_text())
        except Exception as exc:  # noqa: BLE001
            log.warning("could not read job %s's outputs: %s", self.name, type(exc).__name__)
            return {}
        return loaded if isinstance(loaded, dict) else {"result": loaded}
