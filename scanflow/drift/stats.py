"""Pure statistics for drift decisions: no torch, no I/O, easy to test.

Who calls it: `ReconstructionDriftDetector` (calibration and predict) and the benchmark. The window
test compares a window's log reconstruction errors with the held-out calibration set's in mean and
in spread (`window_test`), each as a z-test against the calibration's own variance with a margin for
the calibration set's sampling error, Bonferroni combined; `min_window` finds the smallest window at
which that test holds its rate. `welch_location_scale` is the previous rule (Welch form, the
calibration error counted as random), kept so the benchmark can measure both on the same windows.
docs/drift.md says why and gives the numbers.
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
    from scipy.stats import ttest_ind_from_stats

    if alternative not in ("two-sided", "greater"):
        raise ValueError(f"alternative must be 'two-sided' or 'greater', got {alternative!r}")
    n = len(window)
    if n < 2:
        raise ValueError("a window needs at least 2 samples")
    mean = float(np.mean(window))
    var = float(np.var(window, ddof=1))
    if var <= 0.0 and null.var <= 0.0:  # scipy gives nan here; the verdict is still clear
        if mean == null.mean:
            return 0.0, 1.0
        t = math.copysign(math.inf, mean - null.mean)
        return t, (0.0 if alternative == "two-sided" or t > 0 else 1.0)
    res = ttest_ind_from_stats(
        mean, math.sqrt(var), n, null.mean, math.sqrt(null.var), null.n, equal_var=False, alternative=alternative
    )
    return float(res.statistic), float(res.pvalue)


def abs_deviations(log_errs: NDArray[np.float64]) -> NDArray[np.float64]:
    """|x - median(x)|: the Brown-Forsythe transform; a Welch test on it compares spreads."""
    return np.abs(log_errs - np.median(log_errs))


def welch_location_scale(
    window: NDArray[np.float64],
    location_null: NullStats,
    scale_null: NullStats,
    alternative: Alternative = "two-sided",
) -> tuple[float, float, float, float]:
    """The previous window test: mean (Welch) and spread (Brown-Forsythe about each set's own median,
    Welch form), the calibration set's error counted as random. Kept for comparison (benchmark, tests).

    Its rate is right on average over calibration draws but not per calibration set (one deployment):
    a calibration set drawn 2 standard errors off flags many clean windows. Below ~50 rows the window's
    own median shrinks its deviations and the spread test over-fires. Returns (t_location, t_scale,
    p_location, p_scale); the window's p-value is
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


# -- the window test ---------------------------------------------------------------------------------
def normal_sf(z: NDArray[np.float64] | float) -> NDArray[np.float64]:
    """P(Z > z) for a standard normal Z, elementwise."""
    from scipy.special import ndtr

    return np.asarray(ndtr(-np.asarray(z, dtype=np.float64)))


@dataclass(frozen=True)
class WindowNull:
    """What the window test keeps of the calibration log-errors: their mean and variance (location),
    their median, and the mean and variance of the absolute deviations from that median (spread)."""

    location: NullStats
    median: float
    scale: NullStats

    @classmethod
    def of(cls, log_errs: NDArray[np.float64]) -> WindowNull:
        arr = np.asarray(log_errs, dtype=np.float64)
        if len(arr) < 2:
            raise ValueError("need at least 2 calibration errors")
        med = float(np.median(arr))
        return cls(NullStats.of(arr), med, NullStats.of(np.abs(arr - med)))


def margin_z(
    window_means: NDArray[np.float64] | float,
    n: int,
    null: NullStats,
    margin: float,
    alternative: Alternative = "two-sided",
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """z-test of window means (of n values each) against a calibration null, less a margin for the
    calibration's own error; returns (z, p), elementwise.

    The window's standard error is the calibration's standard deviation over sqrt(n): under the null
    the window has the calibration's variance, and estimating it from the window itself is what made
    2-row windows collapse. The calibration mean is off the population's by about sd / sqrt(null.n);
    `margin` such standard errors are taken off |difference| before testing, so for a calibration
    set within the margin the rate over fresh windows is at most the nominal one (per deployment).
    """
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    if n < 1:
        raise ValueError(f"a window needs at least 1 sample, got {n}")
    var = max(null.var, 1e-300)  # a constant calibration: any difference is infinitely significant
    se_w, se_c = math.sqrt(var / n), math.sqrt(var / null.n)
    d = np.asarray(window_means, dtype=np.float64) - null.mean
    if alternative == "greater":
        z = np.maximum(0.0, d - margin * se_c) / se_w
        return z, normal_sf(z)
    if alternative != "two-sided":
        raise ValueError(f"alternative must be 'two-sided' or 'greater', got {alternative!r}")
    excess = np.maximum(0.0, np.abs(d) - margin * se_c) / se_w
    return np.sign(d) * excess, np.minimum(1.0, 2.0 * normal_sf(excess))


def window_test(
    window: NDArray[np.float64],
    null: WindowNull,
    margin: float,
    alternative: Alternative = "two-sided",
) -> tuple[float, float, float, float]:
    """A window's log-errors against the calibration's: mean and spread (mean |x - calibration median|).

    Returns (z_location, z_scale, p_location, p_scale); the window's p-value is
    `bonferroni(p_location, p_scale)`. Why both: noise raises errors (location), while rotations and
    shifts push some errors up and others down (bilinear blur reconstructs too well), leaving the mean
    near the null but widening the spread. The spread is measured about the calibration's median, not
    the window's: under the null both share it, and a small window's own median shrinks its deviations.
    """
    w = np.asarray(window, dtype=np.float64)
    if len(w) < 1:
        raise ValueError("a window needs at least 1 sample")
    z_loc, p_loc = margin_z(float(w.mean()), len(w), null.location, margin, alternative)
    z_sc, p_sc = margin_z(float(np.abs(w - null.median).mean()), len(w), null.scale, margin, "two-sided")
    return float(z_loc), float(z_sc), float(p_loc), float(p_sc)


def margin_for(confidence: float) -> float:
    """Calibration margin in standard errors: the two-sided normal quantile of `confidence`.

    With confidence c, for a share c of calibration sets each test's offset is inside the margin, and
    such a deployment flags clean windows at most at the stated rate; 0 gives the plain z-test."""
    from scipy.special import ndtri

    if not 0.0 <= confidence < 1.0:
        raise ValueError(f"calibration_confidence must be in [0, 1), got {confidence}")
    return float(ndtri(0.5 + confidence / 2.0))


WINDOW_GRID: tuple[int, ...] = (2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50, 60, 80, 100, 150, 200)
MIN_WINDOW_DRAWS = 3000


def resampled_fpr(
    log_errs: NDArray[np.float64],
    null: WindowNull,
    n: int,
    fpr: float,
    alternative: Alternative = "two-sided",
    *,
    draws: int = MIN_WINDOW_DRAWS,
    rng: np.random.Generator | int = 0,
) -> float:
    """Rate at which `window_test` (no margin) flags windows of n rows resampled from the calibration
    log-errors themselves: the test's rate when its null is exactly true. Pure given the seed."""
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    arr = np.asarray(log_errs, dtype=np.float64)
    w = arr[gen.integers(0, len(arr), size=(draws, n))]
    _, p_loc = margin_z(w.mean(axis=1), n, null.location, 0.0, alternative)
    _, p_sc = margin_z(np.abs(w - null.median).mean(axis=1), n, null.scale, 0.0, "two-sided")
    p = np.minimum(1.0, 2.0 * np.minimum(p_loc, p_sc))
    return float(np.mean(p < fpr))


def min_window(
    log_errs: NDArray[np.float64],
    null: WindowNull,
    fpr: float,
    alternative: Alternative = "two-sided",
    *,
    sizes: tuple[int, ...] = WINDOW_GRID,
    draws: int = MIN_WINDOW_DRAWS,
    seed: int = 0,
) -> int:
    """The smallest window size from which the window test holds its stated rate.

    For each size in `sizes`, windows are resampled from the calibration log-errors (`resampled_fpr`)
    and the size passes when its rate is within Monte-Carlo error of `fpr` (fpr + 3 binomial standard
    errors of `draws`). Returned: the smallest size such that it and every larger size pass (the
    normal approximation only improves with n; a size that fails above a passing one is noise or a
    heavy tail, and the larger one wins). When the largest size fails too, the largest size.
    Why it is needed: with few rows the means of skewed log-errors are not normal, and the rate at
    2-4 rows can be several times the stated one.
    """
    if not sizes or min(sizes) < 1:
        raise ValueError(f"sizes must be positive window sizes, got {sizes}")
    tolerance = fpr + 3.0 * math.sqrt(fpr * (1.0 - fpr) / draws)
    gen = np.random.default_rng(seed)
    ordered = sorted({int(n) for n in sizes})
    passing = [resampled_fpr(log_errs, null, n, fpr, alternative, draws=draws, rng=gen) <= tolerance for n in ordered]
    smallest = ordered[-1]
    for n, ok in zip(reversed(ordered), reversed(passing), strict=True):
        if not ok:
            break
        smallest = n
    return smallest
