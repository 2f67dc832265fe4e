"""Pure statistics for drift decisions: no torch, no I/O, easy to test.

Who calls it: `AutoencoderDriftDetector` (calibration and predict) and the benchmark. The window
test is a one-sided Welch t-test on log reconstruction errors, window against the held-out
calibration set; docs/drift.md says why (power, speed, false-positive rate across splits).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

# Errors are floored before the log so that a perfect reconstruction cannot give -inf.
LOG_FLOOR = 1e-8


@dataclass(frozen=True)
class NullStats:
    """Summary of the calibration (clean, held-out) log-errors: all the Welch test needs."""

    mean: float
    var: float
    n: int

    @classmethod
    def of(cls, log_errors: NDArray[np.float64]) -> NullStats:
        if len(log_errors) < 2:
            raise ValueError("need at least 2 calibration errors")
        return cls(float(np.mean(log_errors)), float(np.var(log_errors, ddof=1)), len(log_errors))


def log_errors(errors: NDArray[np.float64]) -> NDArray[np.float64]:
    """Log of per-sample errors: reconstruction errors are right-skewed; their log is near normal."""
    return np.log(np.maximum(np.asarray(errors, dtype=np.float64), LOG_FLOOR))


def welch_greater(window: NDArray[np.float64], null: NullStats) -> tuple[float, float]:
    """One-sided Welch t-test, H1: the window's mean log-error is larger than the calibration's.

    Returns (t statistic, p-value). Accounts for the calibration set's own sampling error, which is
    what keeps the false-positive rate near the nominal one across reference draws.
    """
    from scipy.special import stdtr

    n = len(window)
    if n < 2:
        raise ValueError("a window needs at least 2 samples")
    mean = float(np.mean(window))
    var = float(np.var(window, ddof=1))
    se2_w, se2_c = var / n, null.var / null.n
    se2 = se2_w + se2_c
    if se2 <= 0.0:
        return (math.inf if mean > null.mean else 0.0), (0.0 if mean > null.mean else 1.0)
    t = (mean - null.mean) / math.sqrt(se2)
    df = se2**2 / (se2_w**2 / (n - 1) + se2_c**2 / (null.n - 1)) if se2_w > 0 and se2_c > 0 else n + null.n - 2
    p = float(stdtr(df, -t))  # survival function of Student's t
    return float(t), p


def error_threshold(calibration_errors: NDArray[np.float64], quantile: float) -> float:
    """The `quantile` of clean calibration errors: samples above it are critical points."""
    if not 0.0 < quantile < 1.0:
        raise ValueError(f"error quantile must be in (0, 1), got {quantile}")
    if len(calibration_errors) * (1.0 - quantile) < 1.0:
        raise ValueError(
            f"error quantile {quantile} is not achievable with {len(calibration_errors)} calibration "
            f"samples: need at least {math.ceil(1.0 / (1.0 - quantile))}"
        )
    return float(np.quantile(calibration_errors, quantile, method="higher"))


def critical_points(errors: NDArray[np.float64], threshold: float) -> NDArray[np.int64]:
    """Indices of samples whose error is beyond the threshold (the candidates for relabelling)."""
    return np.flatnonzero(np.asarray(errors) > threshold).astype(np.int64)
