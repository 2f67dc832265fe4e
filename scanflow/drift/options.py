"""The options every reconstruction drift detector takes, declared once.

`ReconstructionDriftDetector.__init__` holds their defaults and documents each; the image and tabular
detectors add their own arguments and accept these as `**options` typed by `ReconstructionOptions`, so a
new option is added in two places (here and the base constructor), not in every detector.
"""

from __future__ import annotations

from typing import Literal, TypedDict

from scanflow.drift import stats
from scanflow.drift.base import PreprocessFn

__all__ = ["BACKENDS", "EVIDENCE", "Backend", "Evidence", "ReconstructionOptions"]

Backend = Literal["ae", "mmd", "ks", "lsdd"]
Evidence = Literal["combined", "full", "errors"]
EVIDENCE: tuple[str, ...] = ("combined", "full", "errors")
BACKENDS: tuple[str, ...] = ("ae", "mmd", "ks", "lsdd")


class ReconstructionOptions(TypedDict, total=False):
    """Keyword options shared by every reconstruction detector (meanings and defaults:
    `ReconstructionDriftDetector`). A subclass may change a default (`options.setdefault`)."""

    backend: Backend
    fpr: float
    error_quantile: float
    alternative: stats.Alternative
    epochs: int
    batch_size: int
    lr: float
    num_threads: int | None
    calibration_fraction: float
    calibration_confidence: float
    range_margin: float
    evidence: Evidence
    copy_tolerance: float | None
    preprocess_fn: PreprocessFn | None
    seed: int
