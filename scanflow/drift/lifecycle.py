"""One drift detector per champion: found in MLflow, or fitted from the champion's reference and logged.

The detector follows the model that serves: it is fitted on the reference data of the registered model
version that holds the `champion` alias (scanflow.tracking.reference: the training job's reference,
or the serving reference the Executor logs after a drift-triggered promotion), and logged as a run
tagged `scanflow.kind=drift_detector` and `scanflow.model_version=<version>` in the workflow's
experiment. After a promotion the Checker asks for the new champion's detector: none exists yet, so
it is fitted from that version's reference, and windows like the ones that caused the retrain read
as the new normal.

Who calls: the bootstrap (first champion), the Checker (at start and whenever the champion changes).
Blocking (MLflow, torch): async callers use `asyncio.to_thread`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

DETECTOR_TAG = "scanflow.kind"
DETECTOR_KIND = "drift_detector"
VERSION_TAG = "scanflow.model_version"
MODEL_TAG = "scanflow.model_name"
SOURCE_TAG = "scanflow.reference_source"
WARNINGS_TAG = "scanflow.drift_warnings"  # what makes the detector's null uncertain (few distinct rows), if anything
DETECTOR_ARTIFACT = "drift_detector"


@dataclass(frozen=True)
class DetectorOptions:
    """How a detector is fitted: the stated false-positive rate, autoencoder epochs (None: the
    detector's default), torch threads (1: the model is tiny and a busy machine punishes more), and what
    counts as a near-copy (None: the detector's default, a tenth of the reference's median row distance)."""

    fpr: float = 0.05
    epochs: int | None = None
    num_threads: int = 1
    copy_tolerance: float | None = None


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def find_detector_uri(experiment: str, model_name: str, version: str) -> str | None:
    """The newest finished detector fitted for `model_name` version `version`, as a runs:/ URI, or None."""
    from mlflow import MlflowClient

    client = MlflowClient()
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return None
    runs = client.search_runs(
        [exp.experiment_id],
        filter_string=(f"tags.`{DETECTOR_TAG}` = '{DETECTOR_KIND}' and tags.`{MODEL_TAG}` = '{_quote(model_name)}' "
                       f"and tags.`{VERSION_TAG}` = '{_quote(str(version))}' and attributes.status = 'FINISHED'"),
        order_by=["attributes.start_time DESC"], max_results=1)
    return f"runs:/{runs[0].info.run_id}/{DETECTOR_ARTIFACT}" if runs else None


def fit_detector(experiment: str, model_name: str, version: str, options: DetectorOptions | None = None) -> str:
    """Fit a detector on the reference of `model_name` version `version`, log it, return its URI."""
    import mlflow

    from scanflow.drift import fit_reference
    from scanflow.tracking.reference import reference_for_version
    from scanflow.tracking.registry import ensure_experiment

    opts = options or DetectorOptions()
    ref = reference_for_version(model_name, version)
    t0 = time.perf_counter()
    det = fit_reference(ref, fpr=opts.fpr, epochs=opts.epochs, num_threads=opts.num_threads,
                        copy_tolerance=opts.copy_tolerance)
    fit_s = time.perf_counter() - t0
    meta = det.metadata()
    warnings = list(meta.get("warnings") or [])
    tags = {DETECTOR_TAG: DETECTOR_KIND, MODEL_TAG: model_name, VERSION_TAG: str(version), SOURCE_TAG: ref.source,
            "mlflow.note.content": f"Drift detector for {model_name} version {version}, fitted on {ref.source} "
                                  f"({len(ref.x)} reference rows, {meta.get('reference_distinct')} distinct, "
                                  f"{ref.schema.kind}, {ref.schema.n_features} features)."
                                  + "".join(f" Warning: {w}." for w in warnings)}
    if warnings:
        tags[WARNINGS_TAG] = "; ".join(warnings)[:4000]
        for w in warnings:
            log.warning("drift detector for %s v%s: %s", model_name, version, w)
    exp_id = ensure_experiment(experiment)
    with mlflow.start_run(experiment_id=exp_id, run_name=f"drift-detector-{model_name}-v{version}", tags=tags):
        mlflow.log_metrics({"fit_seconds": fit_s, "reference_rows": float(len(ref.x)),
                            "holdout_rows": float(len(ref.x_holdout)),
                            "reference_distinct": float(meta.get("reference_distinct") or 0),
                            "calibration_effective": float(meta.get("calibration_effective") or 0)})
        uri: str = det.log_to_mlflow(DETECTOR_ARTIFACT)
    log.info("fitted the drift detector for %s v%s on %s in %.1fs", model_name, version, ref.source, fit_s)
    return uri


def ensure_detector(experiment: str, model_name: str, version: str, options: DetectorOptions | None = None) -> str:
    """The detector URI for this model version: the logged one, else a freshly fitted and logged one."""
    return find_detector_uri(experiment, model_name, version) or fit_detector(experiment, model_name, version, options)


def load_detector(uri: str) -> Any:
    """Load a logged detector (any kind) from its runs:/ URI."""
    from scanflow.drift import load_detector_from_mlflow

    return load_detector_from_mlflow(uri)
