"""Pure statistics for drift decisions: no torch, no I/O, easy to test.

Who calls it: `AutoencoderDriftDetector` (calibration and predict) and the benchmark. The window
test is a one-sided Welch t-test on log reconstruction errors, window against the held-out
calibration set; docs/drift.md says why (power, speed, false-positive rate across splits).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

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


Alternative = Literal["two-sided", "greater"]


def welch_test(
    window: NDArray[np.float64], null: NullStats, alternative: Alternative = "two-sided"
) -> tuple[float, float]:
    """Welch t-test of the window's mean log-error against the calibration's; returns (t, p-value).

    "two-sided" (default): drift may raise errors (noise, unseen shapes) or lower them (blurred,
    faded inputs reconstruct too well); "greater" tests only for higher errors. Welch accounts for
    the calibration set's own sampling error, which keeps the false-positive rate near the nominal
    one across reference draws.
    """
    from scipy.special import stdtr

    if alternative not in ("two-sided", "greater"):
        raise ValueError(f"alternative must be 'two-sided' or 'greater', got {alternative!r}")
    n = len(window)
    if n < 2:
        raise ValueError("a window needs at least 2 samples")
    mean = float(np.mean(window))
    var = float(np.var(window, ddof=1))
    se2_w, se2_c = var / n, null.var / null.n
    se2 = se2_w + se2_c
    if se2 <= 0.0:
        t = 0.0 if mean == null.mean else math.copysign(math.inf, mean - null.mean)
        df = float(n + null.n - 2)
    else:
        t = (mean - null.mean) / math.sqrt(se2)
        df = (
            se2**2 / (se2_w**2 / (n - 1) + se2_c**2 / (null.n - 1))
            if se2_w > 0 and se2_c > 0
            else n + null.n - 2
        )
    if alternative == "greater":
        p = float(stdtr(df, -t))  # survival function of Student's t
    else:
        p = float(min(1.0, 2.0 * stdtr(df, -abs(t))))
    return float(t), p


def abs_deviations(log_errs: NDArray[np.float64]) -> NDArray[np.float64]:
    """|x - median(x)|: the Brown-Forsythe transform; a Welch test on it compares spreads."""
    return np.abs(log_errs - np.median(log_errs))


def location_scale_test(
    window: NDArray[np.float64],
    location_null: NullStats,
    scale_null: NullStats,
    alternative: Alternative = "two-sided",
) -> tuple[float, float, float, float]:
    """Window log-errors against calibration: mean (Welch) and spread (Brown-Forsythe, Welch form).

    Returns (t_location, t_scale, p_location, p_scale); the window's p-value is
    `bonferroni(p_location, p_scale)`. Why both: noise raises errors (location), while rotations
    and shifts can push some errors up and others down (bilinear blur reconstructs too well), which
    leaves the mean near the null but widens the spread.
    """
    t_loc, p_loc = welch_test(window, location_null, alternative)
    t_scale, p_scale = welch_test(abs_deviations(window), scale_null, "two-sided")
    return t_loc, t_scale, p_loc, p_scale


def bonferroni(*p_values: float) -> float:
    """The smallest p-value times their count, capped at 1: keeps the family's FPR <= the stated one."""
    return float(min(1.0, min(p_values) * len(p_values)))


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
