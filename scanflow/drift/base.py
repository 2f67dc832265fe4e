"""The detector workflow, alibi-detect style: reference data -> fit -> infer threshold -> predict.

Who calls it: subclasses (`ReconstructionDriftDetector`, which the image and tabular autoencoder
detectors build on) implement `_fit`, `_calibrate` and `_predict`;
users and the Checker agent call `fit` once and `predict` per window. The base owns what every
detector must get right the same way: input validation (shape, dtype, finite values), the stated
false-positive rate, the hold-out used for calibration when none is given, and refusing to predict
before it is fitted.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Self

import numpy as np
from numpy.typing import ArrayLike, NDArray

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
    preprocess_fn: applied to every input before the detector sees it (same in fit and predict).
    """

    name = "drift-detector"

    def __init__(
        self,
        *,
        fpr: float = 0.05,
        n_features: int = 64,
        calibration_fraction: float = 0.35,
        preprocess_fn: PreprocessFn | None = None,
        seed: int = 0,
    ) -> None:
        if not 0.0 < fpr < 0.5:
            raise ValueError(f"fpr must be in (0, 0.5), got {fpr}")
        if not 0.0 < calibration_fraction < 1.0:
            raise ValueError(f"calibration_fraction must be in (0, 1), got {calibration_fraction}")
        self.fpr = float(fpr)
        self.n_features = int(n_features)
        self.calibration_fraction = float(calibration_fraction)
        self.preprocess_fn = preprocess_fn
        self.seed = int(seed)
        self.x_ref: Array | None = None
        self.x_cal: Array | None = None
        self._fitted = False

    # -- public workflow -------------------------------------------------------------------------
    @property
    def fitted(self) -> bool:
        return self._fitted

    def fit(self, x_ref: ArrayLike, x_cal: ArrayLike | None = None) -> Self:
        """Fit on reference data, then calibrate the threshold on clean held-out data.

        x_cal: clean data never used in training (e.g. `Splits.x_calibration`); when None, a
        `calibration_fraction` of `x_ref` is held out. Returns self.
        """
        ref = self.validate(x_ref, what="x_ref")
        if x_cal is None:
            rng = np.random.default_rng(self.seed)
            perm = rng.permutation(len(ref))
            n_cal = round(self.calibration_fraction * len(ref))
            if n_cal < 2 or len(ref) - n_cal < 2:
                raise ValueError(f"x_ref has {len(ref)} rows: too few to hold out a calibration set")
            ref, cal = ref[perm[n_cal:]], ref[perm[:n_cal]]
        else:
            cal = self.validate(x_cal, what="x_cal")
        self._check_reference(ref, cal)  # before training: a mis-scaled calibration set fails fast
        self._fitted = False
        self.x_ref = ref
        self._fit(self._preprocess(ref))
        self.infer_threshold(cal)
        return self

    def infer_threshold(self, x_cal: ArrayLike) -> None:
        """(Re)calibrate the null distribution on clean data, at the stated fpr."""
        if self.x_ref is None:
            raise NotFittedError(f"{self.name}: call fit() before infer_threshold()")
        cal = self.validate(x_cal, what="x_cal")
        self.x_cal = cal
        self._calibrate(self._preprocess(cal))
        self._fitted = True

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
