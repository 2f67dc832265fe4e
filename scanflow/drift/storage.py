"""Saving and loading autoencoder drift detectors: a folder of four files, and MLflow artifacts.

Who calls it: `ReconstructionDriftDetector.save` / `load` / `log_to_mlflow` / `load_from_mlflow`
(scanflow/drift/reconstruction.py), which the factory, the bootstrap and the Checker use. It works on
any registered subclass through the detector's own hooks (`_input_state`, `_restore_inputs`,
`_build_model`, `_ranges_of`), so image and tabular detectors share one format.

The folder: detector.json (format version, class name, config, schema, null, min_window, the distinct
reference rows), autoencoder.pt (the model's state dict), inputs.npz (the learnt input scaling) and
calibration.npz (calibration and training rows, their errors, the reference's ranges, the near-copy
space). Loading
rebuilds the saved class and recalibrates on the stored calibration rows: the same model, null and
threshold, no retraining.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scanflow.drift import ranges
from scanflow.drift.base import NotFittedError, PreprocessFn

# 5: calibration.npz holds the near-copy space (copy_scale, copy_limit) and the training rows. 4: calibration.npz holds the
# reference's ranges, detector.json min_window. 3: detector.json names the schema, inputs.npz holds the
# input scaling. 2 (8x8 images in [0, 1], no inputs.npz) to 4 still load (ranges then come from the
# calibration rows; without a near-copy space every row counts once). 1 (full-resolution convolutions)
# does not: refit.
FORMAT_VERSION = 5
READABLE_FORMATS = (2, 3, 4, 5)
DETECTOR_FILE = "detector.json"
MODEL_FILE = "autoencoder.pt"
INPUTS_FILE = "inputs.npz"
CALIBRATION_FILE = "calibration.npz"


def save(det: Any, directory: str | Path) -> Path:
    """Write a fitted `ReconstructionDriftDetector`'s four files into `directory`; returns it."""
    if not det.fitted or det.x_cal is None or det.calibration_errors is None:
        raise NotFittedError(f"{det.name}: fit() before save()")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    torch.save(det._model().state_dict(), out / MODEL_FILE)
    np.savez_compressed(out / INPUTS_FILE, **det._input_state())
    assert det.ranges is not None
    extra: dict[str, Any] = {}
    if det.copy_scale is not None and det.copy_limit is not None:
        extra = {"copy_scale": det.copy_scale, "copy_limit": np.asarray(det.copy_limit)}
    if det.x_ref is not None:
        extra["x_fit"] = det.x_ref  # the input families are calibrated on them too (`_reference_evidence`)
    np.savez_compressed(out / CALIBRATION_FILE, x_cal=det.x_cal, errors=det.calibration_errors,
                        range_lo=det.ranges.lo, range_hi=det.ranges.hi, **extra)
    meta = {
        "format_version": FORMAT_VERSION,
        "class": type(det).__name__,
        "config": det.config(),
        "schema": det.schema(),
        "null": {"mean": det.null.mean, "var": det.null.var, "n": det.null.n} if det.null else None,
        "error_threshold": det.error_threshold,
        "min_window": det.min_window,
        "reference_distinct": det.reference_distinct,
    }
    (out / DETECTOR_FILE).write_text(json.dumps(meta, indent=2))
    return out


def load(cls: Any, directory: str | Path, *, preprocess_fn: PreprocessFn | None = None) -> Any:
    """The detector saved in `directory`, as the registered subclass of `cls` it was saved as.

    ValueError for an unreadable format, an unknown class, or a class that is not `cls` or below it."""
    src = Path(directory)
    meta_path = src / DETECTOR_FILE
    if not meta_path.is_file():
        raise FileNotFoundError(f"no {DETECTOR_FILE} in {src}")
    meta = json.loads(meta_path.read_text())
    if meta.get("format_version") not in READABLE_FORMATS:
        raise ValueError(f"unsupported detector format {meta.get('format_version')!r} in {src}: refit it")
    saved = str(meta.get("class"))
    klass = cls._classes.get(saved)
    if klass is None:
        raise ValueError(f"{src}: detector class {saved!r} is unknown (known: {sorted(cls._classes)}); "
                         "import the module that defines it, or use scanflow.drift.load_detector")
    if not issubclass(klass, cls):
        raise ValueError(  # noqa: TRY004 - the saved file is wrong for this class, not an argument's type
            f"{src} holds a {saved}, not a {cls.__name__}: load it with scanflow.drift.load_detector"
        )
    det = klass(**meta["config"], preprocess_fn=preprocess_fn)
    if (src / INPUTS_FILE).is_file():
        with np.load(src / INPUTS_FILE, allow_pickle=False) as inputs:
            det._restore_inputs({k: inputs[k] for k in inputs.files})
    model = det._build_model()
    model.load_state_dict(torch.load(src / MODEL_FILE, weights_only=True))
    model.eval()
    det.model = model
    with np.load(src / CALIBRATION_FILE, allow_pickle=False) as cal:
        x_cal = cal["x_cal"].astype(np.float32)
        if "range_lo" in cal.files:
            spec = det._ranges_of(x_cal)  # margin and code columns from the config
            det.ranges = ranges.FeatureRanges(cal["range_lo"], cal["range_hi"], spec.margin, spec.integer_columns)
        if "copy_scale" in cal.files:
            det.copy_scale = cal["copy_scale"].astype(np.float64)
            det.copy_limit = float(cal["copy_limit"])
        # the training rows (format 5); before, the calibration rows stand in (and give the ranges)
        x_fit = cal["x_fit"].astype(np.float32) if "x_fit" in cal.files else x_cal
    det.reference_distinct = meta.get("reference_distinct")
    det.x_ref = x_fit
    det.infer_threshold(x_cal)  # the same null and threshold, the same model
    if meta.get("min_window") is not None:
        det.min_window = int(meta["min_window"])  # the saved contract, whatever this version derives
    return det


def log_to_mlflow(det: Any, name: str = "drift_detector", *, tracking_uri: str | None = None) -> str:
    """Log the detector as artifacts under `name` in the active MLflow run (or a new one); its runs:/ URI.

    Blocking: call it off the event loop."""
    import mlflow

    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    with tempfile.TemporaryDirectory() as tmp:
        save(det, tmp)
        active = mlflow.active_run()
        ctx = mlflow.start_run(run_name=name) if active is None else contextlib.nullcontext(active)
        with ctx as run:
            mlflow.log_artifacts(tmp, artifact_path=name)
            mlflow.log_params({f"{name}.{k}": v for k, v in det.config().items()})
            mlflow.log_param(f"{name}.class", type(det).__name__)
            assert det.null is not None and det.error_threshold is not None
            mlflow.log_metrics({
                f"{name}.error_threshold": det.error_threshold,
                f"{name}.null_log_error_mean": det.null.mean,
                f"{name}.null_log_error_var": det.null.var,
                f"{name}.calibration_effective": det.calibration_effective(),
            })
            return f"runs:/{run.info.run_id}/{name}"


def load_from_mlflow(cls: Any, uri: str, *, tracking_uri: str | None = None,
                     preprocess_fn: PreprocessFn | None = None) -> Any:
    """Download the artifacts at `uri` (e.g. "runs:/<id>/drift_detector") and `load` them. Blocking."""
    import mlflow

    with tempfile.TemporaryDirectory() as tmp:
        local = mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=tmp, tracking_uri=tracking_uri)
        return load(cls, local, preprocess_fn=preprocess_fn)
