"""Run a job's `module:function` inside an MLflow run: `python -m scanflow.platform.jobrunner M:F [--params JSON]`.

The one job entry point of every platform:
- LocalPlatform starts it as a child process (so a timeout can kill it and a crash cannot take the
  platform down) with the params in SCANFLOW_JOB_PARAMS (never `--params`: argv is world-readable
  through ps and /proc/PID/cmdline, and params may hold secrets) and MLFLOW_RUN_ID naming the run
  the platform created; `--params` is for running a job by hand;
- a Kubernetes Job's container runs it (scanflow.platform.manifests.job_command) with the params in
  SCANFLOW_JOB_PARAMS (JSON) and MLFLOW_EXPERIMENT_NAME; with no MLFLOW_RUN_ID it opens a run of its
  own, named after SCANFLOW_JOB_NAME.
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
import traceback
from typing import Any

from scanflow.secrets import is_secret, mlflow_params

__all__ = ["is_secret", "load_entrypoint", "main", "public_params", "to_jsonable"]


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
            result = fn(**params)
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
