"""The detector workflow, alibi-detect style: reference data -> fit -> infer threshold -> predict.

Who calls it: subclasses (`ReconstructionDriftDetector`, which the image and tabular autoencoder
detectors build on) implement `_fit`, `_calibrate` and `_predict`;
users and the Checker agent call `fit` once and `predict` per window. The base owns what every
detector must get right the same way: input validation (shape, dtype, finite values), the stated
false-positive rate, the hold-out used for calibration, kept apart from the training rows by groups of
near-copies (`scanflow.drift.copies`), and refusing to predict before it is fitted.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Self

import numpy as np
from numpy.typing import ArrayLike, NDArray

from scanflow.drift import copies
from scanflow.drift.report import DriftReport

Array = NDArray[np.float32]
PreprocessFn = Callable[[Array], Array]


class DriftError(Exception):
    """Base of the drift errors."""


class NotFittedError(DriftError, RuntimeError):
    """`predict` (or save, log) was called before `fit`: fit the detector on reference data first."""


class DriftDetector(ABC):
    """Owns the reference data, optional preprocessing and the false-positive rate.

    fpr: the stated false-positive rate; a window is flagged when its p-value is below it.
    n_features: expected columns of every input (the reference's width; 64 for 8x8 images).
    calibration_fraction: when `fit` gets no calibration data, this share of the reference is held
        out (never trained on) to calibrate the null distribution.
    copy_tolerance: rows whose root-mean-square difference per column is at most this are near-copies of
        one input, in the units `_copy_scale` sets (images: the pixels' own; tables: each column's standard
        deviation, category codes equal); None (default): a tenth of the reference's median distance
        between two rows (`copies.default_tolerance`); 0: identical rows only. Copies stay on one side of
        the fit/calibration split and count once in effective sizes.
    preprocess_fn: applied to every input before the detector sees it (same in fit and predict).
    """

    name = "drift-detector"

    def __init__(
        self,
        *,
        fpr: float = 0.05,
        n_features: int = 64,
        calibration_fraction: float = 0.35,
        copy_tolerance: float | None = None,
        preprocess_fn: PreprocessFn | None = None,
        seed: int = 0,
    ) -> None:
        if copy_tolerance is not None and not (math.isfinite(copy_tolerance) and copy_tolerance >= 0):
            raise ValueError(f"copy_tolerance must be None or a finite number >= 0, got {copy_tolerance}")
        if not 0.0 < fpr < 0.5:
            raise ValueError(f"fpr must be in (0, 0.5), got {fpr}")
        if not 0.0 < calibration_fraction < 1.0:
            raise ValueError(f"calibration_fraction must be in (0, 1), got {calibration_fraction}")
        self.fpr = float(fpr)
        self.n_features = int(n_features)
        self.calibration_fraction = float(calibration_fraction)
        self.preprocess_fn = preprocess_fn
        self.seed = int(seed)
        self.copy_tolerance = None if copy_tolerance is None else float(copy_tolerance)
        self.copy_scale: NDArray[np.float64] | None = None  # learnt in fit: the space copies are judged in
        self.copy_limit: float | None = None  # learnt in fit: the tolerance in that space
        self.reference_distinct: int | None = None  # groups of near-copies among the rows fit was given
        self.x_ref: Array | None = None
        self.x_cal: Array | None = None
        self.cal_groups: NDArray[np.int64] | None = None  # group of each calibration row
        self._training_copies: NDArray[np.float64] | None = None  # x_ref in the near-copy space (`seen`)
        self._fitted = False

    # -- public workflow -------------------------------------------------------------------------
    @property
    def fitted(self) -> bool:
        return self._fitted

    def fit(self, x_ref: ArrayLike, x_cal: ArrayLike | None = None, *, hold_out: float | None = None) -> Self:
        """Fit on reference data, then calibrate the threshold on clean rows it never trained on.

        x_cal: clean data never used in training (e.g. `Splits.x_calibration`); when None, a
        `calibration_fraction` of `x_ref` is held out. hold_out: a share of `x_ref` to hold out and
        join to `x_cal` (more calibration rows than the holdout alone).

        Rows are grouped into near-copies first (`copies.groups`, in the space `_copy_scale` defines)
        and every split keeps a group on one side: a calibration row that is a copy of a training row
        would calibrate the null on memorised rows, and every fresh row would then read as drift. So
        calibration rows with a copy among the reference rows train instead, and when that leaves
        under half of `x_cal` (a holdout cut from the same resampled pool), a `calibration_fraction`
        of the groups is held out as if no `x_cal` were given. Returns self.
        """
        ref = self.validate(x_ref, what="x_ref")
        cal = None if x_cal is None else self.validate(x_cal, what="x_cal")
        if hold_out is not None and not 0.0 < hold_out < 1.0:
            raise ValueError(f"hold_out must be in (0, 1), got {hold_out}")
        rows = ref if cal is None else np.concatenate([ref, cal])
        labels = self._learn_copies(rows)
        self.reference_distinct = int(labels.max()) + 1
        is_cal = np.zeros(len(rows), dtype=bool)
        if cal is not None:
            is_cal[len(ref):] = True
            is_cal &= ~np.isin(labels, labels[:len(ref)])  # copies of training rows train too
            if is_cal.sum() < len(cal) / 2 and hold_out is None:
                hold_out = self.calibration_fraction
        if cal is None or hold_out is not None:  # hold out whole groups of the training side's rows
            free = ~is_cal
            held = copies.split_groups(labels[free], self.calibration_fraction if hold_out is None else hold_out,
                                       seed=self.seed)
            is_cal[np.flatnonzero(free)[held]] = True
        fit_rows, cal_rows = rows[~is_cal], rows[is_cal]
        if len(cal_rows) < 2 or len(fit_rows) < 2:
            raise ValueError(f"{len(rows)} rows in {self.reference_distinct} groups of near-copies: too few to "
                             "hold out a calibration set apart from the training rows")
        self._check_reference(fit_rows, cal_rows)  # before training: a mis-scaled calibration set fails fast
        self._fitted = False
        self.x_ref, self._training_copies = fit_rows, None
        self._fit(self._preprocess(fit_rows))
        self.infer_threshold(cal_rows)
        return self

    def infer_threshold(self, x_cal: ArrayLike) -> None:
        """(Re)calibrate the null distribution on clean data, at the stated fpr."""
        if self.x_ref is None:
            raise NotFittedError(f"{self.name}: call fit() before infer_threshold()")
        cal = self.validate(x_cal, what="x_cal")
        self.x_cal = cal
        self.cal_groups = self.copy_groups(cal)
        self._calibrate(self._preprocess(cal))
        self._fitted = True

    def _learn_copies(self, rows: Array) -> NDArray[np.int64]:
        """Learn the space and tolerance near-copies are judged in from `rows`; their group labels."""
        self.copy_scale = self._copy_scale(rows)
        z = copies.scaled(rows, self.copy_scale)
        keys = self.copy_scale == copies.KEY
        self.copy_limit = (copies.default_tolerance(z, seed=self.seed, keys=keys) if self.copy_tolerance is None
                           else self.copy_tolerance)
        return copies.groups(z, self.copy_limit, seed=self.seed, keys=keys)

    def copy_groups(self, x: Array) -> NDArray[np.int64]:
        """Group label per row of `x` (validated rows): near-copies share one. Before `fit` learnt the
        space (a detector restored from an older format), every row is its own group."""
        if self.copy_scale is None or self.copy_limit is None:
            return np.arange(len(x), dtype=np.int64)
        finite = np.isfinite(x).all(axis=1)
        out = np.arange(len(x), dtype=np.int64) + len(x)  # non-finite rows: groups of their own
        if finite.any():
            out[finite] = copies.groups(copies.scaled(x[finite], self.copy_scale), self.copy_limit, seed=self.seed,
                                        keys=self.copy_scale == copies.KEY)
        return out

    def training_rows_known(self) -> bool:
        """Whether the rows the model trained on are known apart from the calibration rows (a detector
        loaded from an older saved format knows only the calibration rows)."""
        return self.x_ref is not None and self.x_cal is not None and not (
            self.x_ref.shape == self.x_cal.shape and np.array_equal(self.x_ref, self.x_cal))

    def seen(self, x: Array) -> NDArray[np.bool_]:
        """Per row of `x`: a near-copy of a row the model trained on (`copies.near_any`). A model's verdict on
        such a row is memory, not evidence. All False where the training rows are not known."""
        out = np.zeros(len(x), dtype=bool)
        if self.copy_scale is None or self.copy_limit is None or not self.training_rows_known():
            return out
        if self._training_copies is None:
            assert self.x_ref is not None  # training_rows_known
            self._training_copies = copies.scaled(self.x_ref, self.copy_scale)
        finite = np.isfinite(x).all(axis=1)
        if finite.any():
            out[finite] = copies.near_any(copies.scaled(x[finite], self.copy_scale), self._training_copies,
                                          self.copy_limit, keys=self.copy_scale == copies.KEY)
        return out

    def _copy_scale(self, x: Array) -> NDArray[np.float64]:
        """Per-column scale of the space near-copies are judged in: each column's standard deviation over
        `x`, floored (a constant column). Subclasses share one scale where columns share units (pixels), and
        mark key columns (`copies.KEY`: compared exactly, as category codes)."""
        arr = np.asarray(x, dtype=np.float64)
        sd = arr.std(axis=0)
        return np.maximum(sd, 1e-6 * np.maximum(1.0, np.abs(arr.mean(axis=0))))

    def predict(self, x: ArrayLike) -> DriftReport:
        """Test one window against the calibrated null; raises NotFittedError before `fit`."""
        if not self._fitted:
            raise NotFittedError(f"{self.name}: call fit() on reference data before predict()")
        window = self.validate(x, what="x")
        return self._predict(self._preprocess(window))

    # -- helpers ----------------------------------------------------------------------------------
    def validate(self, x: ArrayLike, *, what: str = "x", min_rows: int = 2, allow_nonfinite: bool = False) -> Array:
        """float32 (n, n_features) with finite values, or a ValueError that says what is wrong.

        allow_nonfinite: keep NaN / inf (a detector that reports them per row, as a schema violation)."""
        try:
            arr = np.asarray(x, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{what}: not a numeric array ({exc})") from None
        if arr.ndim > 2 and math.prod(arr.shape[1:]) == self.n_features:
            arr = arr.reshape(len(arr), self.n_features)  # accept images as (n, H, W) or (n, C, H, W)
        if arr.ndim != 2:
            raise ValueError(f"{what}: expected rows of features, shape (n, {self.n_features}), got {arr.shape}")
        if arr.shape[1] != self.n_features:
            raise ValueError(
                f"{what}: expected {self.n_features} features (the reference's schema), got {arr.shape[1]} "
                f"(expected shape (n, {self.n_features}), got {arr.shape})"
            )
        if len(arr) < min_rows:
            raise ValueError(f"{what}: need at least {min_rows} rows, got {len(arr)}")
        if not allow_nonfinite and not np.isfinite(arr).all():
            raise ValueError(f"{what}: contains NaN or infinite values")
        return arr

    def _preprocess(self, x: Array) -> Array:
        return x if self.preprocess_fn is None else self.preprocess_fn(x)

    def metadata(self) -> dict[str, Any]:
        return {"detector": self.name, "fpr": self.fpr}

    def _check_reference(self, x_ref: Array, x_cal: Array) -> None:
        """Hook before training: learn input checks from the reference and vet the calibration rows."""

    # -- what a backend implements ---------------------------------------------------------------
    @abstractmethod
    def _fit(self, x_ref: Array) -> None:
        """Learn from the (preprocessed) reference data."""

    @abstractmethod
    def _calibrate(self, x_cal: Array) -> None:
        """Compute the null statistics from clean held-out data."""

    @abstractmethod
    def _predict(self, x: Array) -> DriftReport:
        """Score one validated, preprocessed window."""
