"""A stand-in training job for the Executor's retrain-idempotency test: registers one model version in
the job's own MLflow run (as scanflow.examples.digits.train does) without torch, so the test stays fast."""

from __future__ import annotations

import os
from typing import Any


def register(extra_points_path: str, alias: str = "challenger", model_name: str = "idem") -> dict[str, Any]:
    """Register a version of `model_name` from the active run (the run Platform.run_job opened)."""
    import mlflow
    from mlflow.tracking import MlflowClient

    run = mlflow.active_run()
    if run is None:
        raise RuntimeError("no active run: run me through Platform.run_job")
    mlflow.log_metric("accuracy_clean", 0.9)
    client = MlflowClient()
    try:
        client.create_registered_model(model_name)
    except mlflow.exceptions.MlflowException:
        pass  # registered by an earlier run
    mv = client.create_model_version(model_name, f"runs:/{run.info.run_id}/model", run_id=run.info.run_id)
    if os.environ.get("IDEM_FAIL"):
        raise RuntimeError("asked to fail")
    return {"version": str(mv.version), "n": os.path.getsize(extra_points_path)}
