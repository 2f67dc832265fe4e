"""`python -m scanflow.platform.jobrun pkg.module:function`: the entry of a Job's container.

Why: a Job spec may name its entrypoint as 'package.module:function'; in a Kubernetes Job (see
manifests.batch_job) this module imports it and calls it with the params from SCANFLOW_JOB_PARAMS
(JSON). Exit code 0 on success, 1 when the function raises (the traceback goes to the pod log,
which KubernetesPlatform.run_job attaches to the MLflow run), 2 on a bad entrypoint or params.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
from typing import Any


def resolve(entrypoint: str) -> Any:
    module_name, _, func_name = entrypoint.partition(":")
    if not module_name or not func_name:
        raise ValueError(f"entrypoint {entrypoint!r} must be 'package.module:function'")
    func = getattr(importlib.import_module(module_name), func_name, None)
    if not callable(func):
        raise TypeError(f"{entrypoint!r}: {func_name!r} is not a function of {module_name!r}")
    return func


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m scanflow.platform.jobrun package.module:function", file=sys.stderr)
        return 2
    try:
        params = json.loads(os.environ.get("SCANFLOW_JOB_PARAMS", "{}"))
        if not isinstance(params, dict):
            raise TypeError("SCANFLOW_JOB_PARAMS must hold a JSON object")
        func = resolve(args[0])
    except (ValueError, TypeError, ImportError) as exc:
        print(f"jobrun: {exc}", file=sys.stderr)
        return 2
    try:
        result = func(**params)
    except Exception:  # noqa: BLE001  # the job failed: its traceback is the log the user needs
        traceback.print_exc()
        return 1
    if result is not None:
        print(json.dumps({"result": result}, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
