"""Run a job's `module:function` inside an MLflow run: `python -m scanflow.platform.jobrunner M:F [--params JSON]`.

The one job entry point of every platform:
- LocalPlatform starts it as a child process (so a timeout can kill it and a crash cannot take the
  platform down) with the params in SCANFLOW_JOB_PARAMS (never `--params`: argv is world-readable
  through ps and /proc/PID/cmdline, and params may hold secrets) and MLFLOW_RUN_ID naming the run
  the platform created; `--params` is for running a job by hand;
- a Kubernetes Job's container runs it (scanflow.platform.manifests.job_command) with the params in
  SCANFLOW_JOB_PARAMS (JSON) and MLFLOW_EXPERIMENT_NAME; with no MLFLOW_RUN_ID it opens a run of its
  own, named after SCANFLOW_JOB_NAME.
A param that names a file of the caller's filesystem (the Executor's plan data) cannot be read from a
Kubernetes Job's pod: the platform logs such files into the job's run and names them in
SCANFLOW_JOB_FILES ({param: artifact path}); the runner downloads each one that is not on its own
filesystem and calls the function with the local copy (the params logged stay the caller's values,
which the Executor's retry lookup searches by).
It logs the non-secret params, calls fn(**params), and records the return value: as the artifact
`outputs.json` in the run, and as JSON in the file named by SCANFLOW_JOB_OUTPUT (read by the
platform without a round trip to MLflow). Exit code 0 on success, 1 when the function raised
(traceback on stderr: the pod log), 2 on a bad command line, entrypoint or params.
`python -m scanflow.platform.jobrun M:F` (the former Kubernetes entry) still works: it calls `main`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
import traceback
from typing import Any

from scanflow.secrets import is_secret, mlflow_params

__all__ = ["is_secret", "load_entrypoint", "localize", "main", "public_params", "shippable_files", "to_jsonable"]
FILES_ENV = "SCANFLOW_JOB_FILES"


def shippable_files(params: dict[str, Any]) -> dict[str, str]:
    """Pure but for `os.path.isfile`: {param: absolute path} for each non-secret param naming an existing
    file of this filesystem, which a job running elsewhere cannot open (ship it in the job's run)."""
    return {k: v for k, v in params.items()
            if isinstance(v, str) and not is_secret(k) and os.path.isabs(v) and os.path.isfile(v)}


def artifact_path(param: str, path: str) -> str:
    """Where a shipped file lies in the job's run."""
    return f"inputs/{param}/{os.path.basename(path)}"


def localize(params: dict[str, Any], files: dict[str, str], fetch: Any) -> dict[str, Any]:
    """The params the function is called with: each shipped file that this filesystem lacks is replaced
    by `fetch(artifact_path)` (a local copy); a file already here (the same machine) is used as is."""
    out = dict(params)
    for name, artifact in files.items():
        if name in out and not os.path.exists(str(out[name])):
            out[name] = fetch(artifact)
    return out


def public_params(params: dict[str, Any]) -> dict[str, str]:
    """Params fit to log to MLflow (secrets dropped by scanflow.secrets, values as short strings)."""
    return mlflow_params(params)


def to_jsonable(value: Any) -> dict[str, Any]:
    """A function's return value -> a JSON object (non-dicts under 'result'; unknown types as str)."""
    if value is None:
        return {}
    out = value if isinstance(value, dict) else {"result": value}
    return json.loads(json.dumps(out, default=str))


def load_entrypoint(entrypoint: str) -> Any:
    module_name, _, func_name = entrypoint.partition(":")
    if not module_name or not func_name:
        raise ValueError(f"entrypoint {entrypoint!r} must be 'package.module:function'")
    fn = getattr(importlib.import_module(module_name), func_name, None)
    if not callable(fn):
        raise TypeError(f"{entrypoint!r}: {module_name} has no function {func_name!r}")
    return fn


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scanflow.platform.jobrunner")
    parser.add_argument("entrypoint", help="package.module:function")
    parser.add_argument("--params", default=None,
                        help="JSON object of keyword arguments (default: env SCANFLOW_JOB_PARAMS, else {})")
    args = parser.parse_args(argv)
    source = "--params" if args.params is not None else "SCANFLOW_JOB_PARAMS"
    text = args.params if args.params is not None else os.environ.get("SCANFLOW_JOB_PARAMS", "").strip() or "{}"
    try:
        params = json.loads(text)
        if not isinstance(params, dict):
            raise TypeError(f"{source} must be a JSON object")
        fn = load_entrypoint(args.entrypoint)
    except (ValueError, TypeError, ImportError) as exc:
        print(f"jobrunner: {exc}", file=sys.stderr)
        return 2

    import mlflow

    run_id = os.environ.get("MLFLOW_RUN_ID") or None
    run_name = None if run_id else os.environ.get("SCANFLOW_JOB_NAME") or None
    with mlflow.start_run(run_id=run_id, run_name=run_name) as run:
        mlflow.log_params(public_params(params))
        try:
            files = json.loads(os.environ.get(FILES_ENV, "").strip() or "{}")
            call = localize(params, files, lambda artifact: mlflow.artifacts.download_artifacts(
                run_id=run.info.run_id, artifact_path=artifact,
                dst_path=tempfile.mkdtemp(prefix="scanflow-job-inputs-")))
            result = fn(**call)
        except Exception:  # noqa: BLE001 - the job's own failure: record it, exit 1
            traceback.print_exc()
            sys.stdout.flush()
            mlflow.set_tag("scanflow.job.error", traceback.format_exc(limit=3)[-4000:])
            return 1
        outputs = to_jsonable(result)
        mlflow.log_dict(outputs, "outputs.json")
        out_file = os.environ.get("SCANFLOW_JOB_OUTPUT")
        if out_file:
            with open(out_file, "w") as f:
                json.dump(outputs, f)
        print(f"jobrunner: {args.entrypoint} finished in run {run.info.run_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
