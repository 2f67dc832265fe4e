"""Schema-driven construction: the detector a `DataSchema` needs, fitted from a `Reference`, and loading any.

Who calls it: the bootstrap and the Checker agent. They know a model only by the reference data and
schema its training job logged (scanflow/tracking/reference.py), so they ask here for "the detector
for this schema" instead of naming a class, and load a saved detector by the class its detector.json
names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scanflow.drift.base import PreprocessFn
from scanflow.drift.detector import AutoencoderDriftDetector
from scanflow.drift.reconstruction import ReconstructionDriftDetector
from scanflow.drift.tabular import TabularAutoencoderDriftDetector
from scanflow.tracking.reference import DataSchema, Reference


def detector_for(
    schema: DataSchema, *, fpr: float = 0.05, epochs: int | None = None, num_threads: int | None = 1, seed: int = 0,
    copy_tolerance: float | None = None,
) -> ReconstructionDriftDetector:
    """An unfitted detector for `schema`: images -> `AutoencoderDriftDetector(image_shape=...)`,
    tabular -> `TabularAutoencoderDriftDetector(n_features, categorical=...)`.

    epochs: None keeps the detector's default (30 for images, 60 for tabular rows).
    num_threads: torch threads for fitting and scoring; 1 by default (agents share a busy machine).
    copy_tolerance: what counts as a near-copy (`DriftDetector`; None: the detector's default).
    """
    common: dict[str, Any] = {"fpr": fpr, "num_threads": num_threads, "seed": seed, "copy_tolerance": copy_tolerance}
    if epochs is not None:
        common["epochs"] = int(epochs)
    if schema.kind == "image":
        return AutoencoderDriftDetector(image_shape=tuple(schema.image_shape), **common)
    if schema.kind == "tabular":
        return TabularAutoencoderDriftDetector(schema.n_features, categorical=schema.categorical, **common)
    raise ValueError(f"no drift detector for schema kind {schema.kind!r}; expected 'image' or 'tabular'")


MIN_CALIBRATION_ROWS = 200  # holdout rows enough to calibrate on alone (the null's mean and variance)


def fit_reference(ref: Reference, **kwargs: Any) -> ReconstructionDriftDetector:
    """`detector_for(ref.schema, **kwargs)` fitted on `ref.x` and calibrated on clean rows it never trained on.

    Images with at least MIN_CALIBRATION_ROWS holdout rows: the convolutional autoencoder trains on all
    of `ref.x` and the holdout calibrates it. Trained on 35 % fewer rows, the digits autoencoder's clean
    errors spread so that S1's drifted rows stayed under the calibration quantile (5 critical points in
    a 200-row drifted window instead of 132, same verdict) and the Planner never gathered enough to
    retrain. Otherwise (tabular rows; a serving reference's few labelled rows) a `calibration_fraction`
    (0.35) of `ref.x` is held out (seeded, whole groups of near-copies at a time) and joined to
    `ref.x_holdout`, and the autoencoder trains on the rest only: on generated 13-column tables the larger calibration set held the false-positive
    rate at 0.025 where the holdout alone gave 0.15 (40 windows, one seed). More calibration rows give a steadier null (docs/drift.md, what
    "FPR" means); the held-out reference rows also keep the calibration like the traffic `x` stands for.
    Holdout rows that are near-copies of `ref.x` rows train instead (`DriftDetector.fit`).
    Blocking (seconds): async callers use `asyncio.to_thread`.
    """
    det = detector_for(ref.schema, **kwargs)
    x = det.validate(ref.x, what="reference x")
    holdout = det.validate(ref.x_holdout, what="reference x_holdout")
    if ref.schema.kind == "image" and len(holdout) >= MIN_CALIBRATION_ROWS:
        return det.fit(x, holdout)
    return det.fit(x, holdout, hold_out=det.calibration_fraction)


def load_detector(directory: str | Path, *, preprocess_fn: PreprocessFn | None = None) -> ReconstructionDriftDetector:
    """A detector written by `save`, as the class its detector.json names (image or tabular)."""
    return ReconstructionDriftDetector.load(directory, preprocess_fn=preprocess_fn)


def load_detector_from_mlflow(
    uri: str, *, tracking_uri: str | None = None, preprocess_fn: PreprocessFn | None = None
) -> ReconstructionDriftDetector:
    """A detector logged by `log_to_mlflow` ("runs:/<id>/drift_detector"), as the class it was saved as."""
    return ReconstructionDriftDetector.load_from_mlflow(uri, tracking_uri=tracking_uri, preprocess_fn=preprocess_fn)
