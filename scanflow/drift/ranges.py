"""Input checks that are not drift: values outside the reference's range, non-finite values, codes that are not integers.

Who calls it: `ReconstructionDriftDetector` learns `FeatureRanges` from the reference rows in `fit`,
refuses a calibration set that looks mis-scaled against them (`check_calibration`), and screens every
window (`screen`) before the drift test. Why apart from drift: an integration bug (0-255 pixels sent to
a model whose reference is in [0, 1], a column in other units) moves every row far off the reference;
a drift test would flag it, and someone would be paged for "drift" when the fix is in the caller.
Such rows are reported as a schema violation. Rows off by more than GROSS_EXCESS reference widths (or
not finite, or with non-integer codes) are also left out of the drift test: nothing of the reference's
distribution explains them, so `is_drift` stays a statement about inputs on the reference's scale.
Rows nearer than that (a sensor recalibrated to other units, a shifted operating point) stay in the
test: they are the drift a retrain can learn, and the report names the columns as well.
Pure functions, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

DEFAULT_MARGIN = 0.25  # share of a column's reference width allowed beyond its minimum and maximum
WIDTH_FLOOR = 1e-6  # relative: a constant column's width is at least WIDTH_FLOOR * max(1, |value|)
MISSCALED_SHARE = 0.10  # a calibration column with more of its values out of range is refused
MAX_LISTED_COLUMNS = 100  # the report lists at most this many columns (and counts them all)
# Beyond this many reference widths a value is off scale, not drifted: 0-255 pixels against [0, 1] are
# ~254 out; a thermocouple switched to degF is ~1-2 out of its degC range and is a drift to learn.
GROSS_EXCESS = 5.0


@dataclass(frozen=True)
class FeatureRanges:
    """Per column: the reference's minimum and maximum (NaN: not range-checked, e.g. category codes),
    the allowed margin as a share of the column's width, and which columns must hold integer codes."""

    lo: NDArray[np.float64]
    hi: NDArray[np.float64]
    margin: float = DEFAULT_MARGIN
    integer_columns: tuple[int, ...] = ()

    def width(self) -> NDArray[np.float64]:
        floor = WIDTH_FLOOR * np.maximum(1.0, np.maximum(np.abs(self.lo), np.abs(self.hi)))
        return np.maximum(self.hi - self.lo, floor)

    def bounds(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """(lower, upper) allowed per column; NaN for unchecked columns."""
        pad = self.margin * self.width()
        return self.lo - pad, self.hi + pad


def learn_ranges(
    x_ref: NDArray[np.floating[Any]],
    *,
    margin: float = DEFAULT_MARGIN,
    unchecked: tuple[int, ...] = (),
    integer_columns: tuple[int, ...] = (),
    shared: bool = False,
) -> FeatureRanges:
    """The reference's range per column; `shared`: one range for all columns (image pixels share a scale,
    and a border pixel that is always 0 in the reference may carry ink or noise in a clean window)."""
    if margin < 0:
        raise ValueError(f"range margin must be >= 0, got {margin}")
    x = np.asarray(x_ref, dtype=np.float64)
    if x.ndim != 2 or len(x) < 1:
        raise ValueError(f"reference rows: expected shape (n >= 1, features), got {x.shape}")
    if shared:
        lo, hi = np.full(x.shape[1], x.min()), np.full(x.shape[1], x.max())
    else:
        lo, hi = x.min(axis=0), x.max(axis=0)
    if unchecked:
        lo[list(unchecked)], hi[list(unchecked)] = np.nan, np.nan
    return FeatureRanges(lo, hi, float(margin), tuple(int(c) for c in integer_columns))


@dataclass(frozen=True)
class Screen:
    """What `screen` found in a window: which rows may enter the drift test, and the violation, if any."""

    ok_rows: NDArray[np.bool_]
    violation: dict[str, Any] | None


def _excess(x: NDArray[np.float64], ranges: FeatureRanges) -> NDArray[np.float64]:
    """How far each value is beyond its column's allowed bounds, in units of the column's reference width
    (0 inside, NaN for non-finite values and unchecked columns)."""
    lower, upper = ranges.bounds()
    width = ranges.width()
    with np.errstate(invalid="ignore"):
        out = np.maximum(np.maximum(lower - x, x - upper), 0.0) / width
    return np.where(np.isfinite(x), out, np.nan)


def screen(x: NDArray[np.floating[Any]], ranges: FeatureRanges) -> Screen:
    """Rows with a non-finite value, a value beyond its column's bounds or a non-integer code are described
    in the violation; those off scale (beyond GROSS_EXCESS widths), non-finite or with a non-integer code
    are kept out of the drift test:

    {"columns": [...], "n_columns": k, "rows": r, "fraction_out": r / n, "max_excess": e,
     "off_scale_rows": g, "non_finite_rows": f, "non_integer_columns": [...]}

    `max_excess` is the furthest value beyond its bound, in reference widths of its column (0-255 pixels
    against a [0, 1] reference: ~254). None when every row is fine.
    """
    arr = np.asarray(x, dtype=np.float64)
    finite = np.isfinite(arr)
    excess = _excess(arr, ranges)
    out = np.nan_to_num(excess, nan=0.0) > 0.0
    bad = out | ~finite
    excluded = (np.nan_to_num(excess, nan=0.0) > GROSS_EXCESS) | ~finite
    non_integer: list[int] = []
    for c in ranges.integer_columns:
        col = arr[:, c]
        wrong = finite[:, c] & (col != np.round(col))
        if wrong.any():
            non_integer.append(int(c))
            bad[:, c] |= wrong
            excluded[:, c] |= wrong
    bad_rows = bad.any(axis=1)
    excluded_rows = excluded.any(axis=1)
    if not bad_rows.any():
        return Screen(np.ones(len(arr), dtype=bool), None)
    columns = np.flatnonzero(bad.any(axis=0))
    max_excess = float(np.nanmax(np.where(out, excess, np.nan))) if out.any() else 0.0
    violation = {
        "columns": [int(c) for c in columns[:MAX_LISTED_COLUMNS]],
        "n_columns": len(columns),
        "rows": int(bad_rows.sum()),
        "fraction_out": float(bad_rows.mean()),
        "max_excess": max_excess,
        "off_scale_rows": int(excluded_rows.sum()),
        "non_finite_rows": int((~finite).any(axis=1).sum()),
        "non_integer_columns": non_integer,
    }
    return Screen(~excluded_rows, violation)


def check_calibration(x_cal: NDArray[np.floating[Any]], ranges: FeatureRanges, *, what: str = "x_cal") -> None:
    """Refuse calibration rows that look mis-scaled against the reference: a ValueError naming the columns
    where more than MISSCALED_SHARE of the values lie beyond the reference's range and margin.

    Calibration rows are clean rows of the reference's distribution (its holdout); if they are not
    even in its range, the two were written on different scales, and a detector calibrated on them
    would be wrong about every window.
    """
    excess = np.nan_to_num(_excess(np.asarray(x_cal, dtype=np.float64), ranges), nan=0.0)
    share = (excess > 0.0).mean(axis=0)
    cols = np.flatnonzero(share > MISSCALED_SHARE)
    if len(cols):
        worst = int(cols[np.argmax(share[cols])])
        raise ValueError(
            f"{what} looks mis-scaled against the reference rows: in columns {[int(c) for c in cols[:20]]} more "
            f"than {MISSCALED_SHARE:.0%} of the values lie beyond the reference's range (column {worst}: "
            f"{share[worst]:.0%}, up to {excess[:, worst].max():.3g} reference widths out); "
            "pass calibration rows on the reference's scale"
        )
