"""Drift detection: torch autoencoders, critical points, a calibrated window test, typed reports.

Public API: `AutoencoderDriftDetector` (images), `TabularAutoencoderDriftDetector` (tabular rows),
their base `ReconstructionDriftDetector` (the options both take: `ReconstructionOptions`), `detector_for` / `fit_reference` (the detector a
`DataSchema` needs), `load_detector` / `load_detector_from_mlflow` (any saved detector),
`DriftDetector` (base), `DriftReport`, `NotFittedError`, `DriftError`. Importing this package loads
torch (the detectors' models); alibi-detect is only imported when a backend other than "ae" is asked for.
"""

from __future__ import annotations

from scanflow.drift.alibi_backend import alibi_available
from scanflow.drift.base import DriftDetector, DriftError, NotFittedError
from scanflow.drift.detector import AutoencoderDriftDetector
from scanflow.drift.factory import detector_for, fit_reference, load_detector, load_detector_from_mlflow
from scanflow.drift.options import BACKENDS, ReconstructionOptions
from scanflow.drift.reconstruction import ReconstructionDriftDetector
from scanflow.drift.report import DriftReport
from scanflow.drift.tabular import TabularAutoencoderDriftDetector

__all__ = [
    "BACKENDS",
    "AutoencoderDriftDetector",
    "DriftDetector",
    "DriftError",
    "DriftReport",
    "NotFittedError",
    "ReconstructionDriftDetector",
    "ReconstructionOptions",
    "TabularAutoencoderDriftDetector",
    "alibi_available",
    "detector_for",
    "fit_reference",
    "load_detector",
    "load_detector_from_mlflow",
]
