"""Drift detection: a torch autoencoder, critical points, a calibrated window test, typed reports.

Public API: `AutoencoderDriftDetector`, `DriftDetector` (base), `DriftReport`, `NotFittedError`,
`DriftError`. Importing this package loads torch (the detector's model); alibi-detect is only
imported when a backend other than "ae" is asked for.
"""

from __future__ import annotations

from scanflow.drift.base import DriftDetector, DriftError, NotFittedError
from scanflow.drift.detector import BACKENDS, AutoencoderDriftDetector, alibi_available
from scanflow.drift.report import DriftReport

__all__ = [
    "BACKENDS",
    "AutoencoderDriftDetector",
    "DriftDetector",
    "DriftError",
    "DriftReport",
    "NotFittedError",
    "alibi_available",
]
