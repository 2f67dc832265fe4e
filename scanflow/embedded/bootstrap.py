"""Bootstrap a workflow's knowledge base: a first champion model and a fitted drift detector.

Run once per stack home, before the agents start, as its own process
(`python -m scanflow.embedded.bootstrap --workflow W.yaml [--quick]`, MLFLOW_TRACKING_URI set), so
the caller never imports torch. Idempotent: a champion that exists and a detector already logged are
kept. The detector is fitted on the reference (training) data, calibrated on held-out clean data and
logged as artifacts of an MLflow run tagged `scanflow.kind=drift_detector` in the workflow's
experiment, where the Checker finds it (`find_detector_uri`).
Who calls: scanflow.embedded.stack.EmbeddedStack; people, by hand.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from scanflow.spec import Workflow

log = logging.getLogger(__name__)

DETECTOR_TAG = "scanflow.kind"
DETECTOR_KIND = "drift_detector"
DETECTOR_ARTIFACT = "drift_detector"
ReferenceFn = Callable[[], tuple[np.ndarray, np.ndarray]]


def digits_reference() -> tuple[np.ndarray, np.ndarray]:
    """(reference, calibration) rows of the digits workflow: its training split and held-out clean data."""
    from workflows.digits.data import load_splits

    s = load_splits(0)
    return s.x_train, s.x_calibration


def find_detector_uri(experiment: str) -> str | None:
    """The newest drift detector logged for `experiment` ("runs:/<id>/drift_detector"), or None. Blocking."""
    from mlflow import MlflowClient

    client = MlflowClient()
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return None
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`{DETECTOR_TAG}` = '{DETECTOR_KIND}'",
                              order_by=["attributes.start_time DESC"], max_results=1)
    return f"runs:/{runs[0].info.run_id}/{DETECTOR_ARTIFACT}" if runs else None


def fit_detector(experiment: str, reference: ReferenceFn, *, fpr: float, quick: bool) -> str:
    """Fit, calibrate and log the autoencoder drift detector; returns its artifact URI."""
    import mlflow

    from scanflow.drift import AutoencoderDriftDetector
    from scanflow.tracking.registry import ensure_experiment

    x_ref, x_cal = reference()
    # One torch thread: the model is tiny, and on a busy 2-core machine two threads contend so badly
    # that 15 epochs took 120 s instead of 6 s (measured at load ~12).
    det = AutoencoderDriftDetector(fpr=fpr, epochs=15 if quick else 30, num_threads=1)
    det.fit(x_ref, x_cal)
    exp_id = ensure_experiment(experiment)
    with mlflow.start_run(experiment_id=exp_id, run_name="drift-detector",
                          tags={DETECTOR_TAG: DETECTOR_KIND}):
        return det.log_to_mlflow(DETECTOR_ARTIFACT)


def bootstrap(workflow: Workflow, *, quick: bool = False, reference: ReferenceFn = digits_reference) -> dict[str, Any]:
    """First champion (the workflow's first job, alias champion) and the drift detector, unless present."""
    from scanflow.platform.jobrunner import load_entrypoint
    from scanflow.tracking.registry import CHAMPION, get_alias_version

    out: dict[str, Any] = {}
    job = workflow.jobs[0]
    model_name = str(job.params.get("model_name", workflow.name))
    champion = get_alias_version(model_name, CHAMPION)
    if champion is None:
        if not isinstance(job.entrypoint, str):
            raise ValueError(f"job {job.name!r}: bootstrap needs a Python entrypoint 'module:function'")
        fn = load_entrypoint(job.entrypoint)
        result = fn(**{**job.params, "alias": CHAMPION})
        champion = str(result.get("version")) if isinstance(result, dict) else get_alias_version(model_name, CHAMPION)
        out["trained"] = result
    out["champion"] = champion
    checker = next((a for a in workflow.agents if a.role == "checker"), None)
    fpr = float((checker.settings if checker else {}).get("fpr", 0.05))
    uri = find_detector_uri(workflow.name)
    if uri is None:
        uri = fit_detector(workflow.name, reference, fpr=fpr, quick=quick)
    out["detector_uri"] = uri
    return out


def main(argv: list[str] | None = None) -> int:
    from scanflow.spec import load_workflow

    parser = argparse.ArgumentParser(prog="python -m scanflow.embedded.bootstrap")
    parser.add_argument("--workflow", required=True)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    result = bootstrap(load_workflow(args.workflow), quick=args.quick)
    print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
