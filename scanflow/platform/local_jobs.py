"""Jobs on this machine: one child process per job, inside the job's MLflow run (scanflow.platform.jobruns).

Who calls: LocalPlatform.run_job (the Executor's retrain, `scanflow deploy`'s jobs, tests).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from scanflow.platform import processes as procs
from scanflow.platform.base import JobResult, PlatformError
from scanflow.platform.jobruns import JobRun
from scanflow.spec import Job


def job_argv(python: str, job: Job) -> list[str]:
    """The command line of a job's child process. A 'module:function' job runs through the job
    runner with its params in the environment (SCANFLOW_JOB_PARAMS), never in argv: a command line
    is world-readable (ps, /proc/PID/cmdline) and params may hold secrets. A command list runs as given."""
    if isinstance(job.entrypoint, str):
        return [python, "-m", "scanflow.platform.jobrunner", job.entrypoint]
    return list(job.entrypoint)


def run_local_job(job: Job, params: dict[str, Any] | None, *, tracking_uri: str, experiment: str, jobs_dir: Path,
                  env: dict[str, str], python: str) -> JobResult:
    """Run a job to completion or timeout as a child process (its environment: `env`, the platform's job
    environment), inside an MLflow run holding its log. Its outputs are what its runner wrote to
    SCANFLOW_JOB_OUTPUT."""
    merged = {**job.params, **(params or {})}
    try:
        args_json = json.dumps(merged)
    except TypeError as exc:
        raise PlatformError(f"job {job.name!r}: params must be JSON-serialisable: {exc}") from None
    run = JobRun.open(tracking_uri, experiment, job, job.name, merged)
    log_path = jobs_dir / f"{job.name}-{run.run_id}.log"
    out_path = jobs_dir / f"{job.name}-{run.run_id}.outputs.json"
    env = env | {
        "MLFLOW_RUN_ID": run.run_id, "MLFLOW_EXPERIMENT_ID": run.experiment_id,
        "SCANFLOW_JOB_OUTPUT": str(out_path), "SCANFLOW_JOB_PARAMS": args_json,
    }
    start = time.monotonic()
    try:
        proc = procs.spawn(job_argv(python, job), log_path, env)
    except OSError as exc:
        run.finish("FAILED", 0.0, log_text=f"cannot start: {exc}")
        return JobResult(name=job.name, succeeded=False, run_id=run.run_id, message=f"cannot start: {exc}")
    timed_out = False
    code: int | None
    try:
        code = proc.wait(timeout=job.timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        code = procs.stop(proc, 5.0)
    duration = time.monotonic() - start
    outputs: dict[str, Any] = {}
    if out_path.exists():
        try:
            outputs = json.loads(out_path.read_text())
        except ValueError:
            outputs = {}
    ok = code == 0 and not timed_out
    note = run.finish("KILLED" if timed_out else ("FINISHED" if ok else "FAILED"), duration, log_file=log_path,
                      exit_code=code)
    if timed_out:
        msg = f"timed out after {job.timeout_s:.0f}s; killed"
    elif ok:
        msg = "succeeded"
    else:
        msg = f"exited with code {code}; see the run's logs/{log_path.name}"
    return JobResult(name=job.name, succeeded=ok, run_id=run.run_id, exit_code=code,
                     duration_s=duration, message=msg + note, outputs=outputs)
