"""`TabularAutoencoderDriftDetector`: drift in rows of numeric and categorical columns.

Who calls it: `scanflow.drift.detector_for` / `fit_reference` for a tabular `DataSchema`, so the Checker
agent watches any team's tabular model without knowing its dataset. The decision, calibration and
persistence are `ReconstructionDriftDetector`'s; this class adds the encoding of a row:
- numeric columns are standardised with the reference's mean and standard deviation (floored, so a
  constant column stays finite; a change in it then reconstructs badly, which is drift);
- categorical columns (integer codes) are one-hot encoded over the codes seen in the reference; an
  unseen code (or a non-integer one) encodes as all zeros, which the autoencoder never saw and
  reconstructs badly;
and the model, a dense autoencoder: hidden width from the encoded width, latent from the encoded reference's
principal components (`latent_width`).
The per-sample error is the mean squared error over the encoded values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Unpack

import numpy as np
from numpy.typing import NDArray

from scanflow.drift import copies, ranges
from scanflow.drift.autoencoder import DenseAutoencoder
from scanflow.drift.base import Array
from scanflow.drift.options import ReconstructionOptions
from scanflow.drift.reconstruction import ReconstructionDriftDetector

STD_FLOOR = 1e-6  # relative: a column's std is at least STD_FLOOR * max(1, |mean|)
MAX_CATEGORIES = 1000  # distinct codes one categorical column may have in the reference
CLIP = 1e4  # standardised values are clipped here: far beyond any clean row, and squares stay finite
VARIANCE_SHARE = 0.9  # the latent keeps the principal components that carry this share of the variance


def hidden_width(encoded: int) -> int:
    """Hidden layer width for an encoded width: twice it, in [16, 256]."""
    return int(min(256, max(16, 2 * encoded)))


def latent_width(encoded_rows: NDArray[np.float32], share: float = VARIANCE_SHARE) -> int:
    """Latent width: the principal components that carry `share` of the encoded reference's variance,
    at least 1 and at most the encoded width - 1, so the autoencoder cannot learn the identity.

    Why from the data and not half the encoded width: a latent wider than the data's own dimension
    spends the spare units on noise and reconstructs shifted rows nearly as well as clean ones
    (measured, 13 features with 6 latent factors: half the width gave a latent of 8 and caught a
    changed category mix in 0.38 of 200-row windows at seed 0; 90% of the variance gave 7 and 1.00).
    """
    width = encoded_rows.shape[1]
    centred = encoded_rows.astype(np.float64) - encoded_rows.mean(axis=0, dtype=np.float64)
    var = np.linalg.svd(centred, compute_uv=False) ** 2
    if width < 2 or var.sum() <= 0:
        return 1
    k = int(np.searchsorted(np.cumsum(var) / var.sum(), share) + 1)
    return int(min(max(1, k), width - 1))


class TabularAutoencoderDriftDetector(ReconstructionDriftDetector):
    """Drift detector for tabular rows (n, n_features); `categorical` lists the columns holding codes.

    hidden, latent_dim: layer widths; None sizes them from the reference: hidden from the encoded
        width (`hidden_width`), latent from the encoded rows' variance (`latent_width`).
    epochs, lr: 60 at 1e-2 by default: ~1,000 rows of a dozen columns fit in about 2 s on one thread.
    Other arguments: `ReconstructionDriftDetector`.
    """

    name = "tabular-autoencoder"
    kind = "tabular"

    def __init__(
        self,
        n_features: int,
        *,
        categorical: Sequence[int] = (),
        hidden: int | None = None,
        latent_dim: int | None = None,
        **options: Unpack[ReconstructionOptions],
    ) -> None:
        if not isinstance(n_features, int | np.integer) or n_features < 1:
            raise ValueError(f"n_features must be an integer >= 1, got {n_features!r}")
        cats = tuple(int(c) for c in categorical)
        bad = [c for c in cats if not 0 <= c < n_features]
        if bad or len(set(cats)) != len(cats):
            raise ValueError(f"categorical {list(cats)}: expected distinct column indices in [0, {n_features})")
        if (hidden is not None and hidden < 1) or (latent_dim is not None and latent_dim < 1):
            raise ValueError(f"hidden ({hidden}) and latent_dim ({latent_dim}) must be >= 1 when given")
        options.setdefault("epochs", 60)  # a dense model on a dozen columns wants more, faster steps
        options.setdefault("lr", 1e-2)
        super().__init__(n_features=int(n_features), **options)
        self.categorical = tuple(sorted(cats))
        self.numeric = tuple(c for c in range(self.n_features) if c not in set(cats))
        self.hidden = hidden
        self.latent_dim = latent_dim
        self.mean: NDArray[np.float32] | None = None  # per numeric column
        self.std: NDArray[np.float32] | None = None
        self.categories: list[NDArray[np.float32]] = []  # per categorical column, the codes seen
        self.fitted_latent: int | None = None  # latent_width of the reference, when latent_dim is None

    # -- input encoding -------------------------------------------------------------------------
    def _fit_inputs(self, x_ref: Array) -> None:
        num = x_ref[:, list(self.numeric)].astype(np.float64)
        mean = num.mean(axis=0)
        std = np.maximum(num.std(axis=0), STD_FLOOR * np.maximum(1.0, np.abs(mean)))
        categories = []
        for c in self.categorical:
            col = x_ref[:, c]
            if not np.all(col == np.round(col)):
                raise ValueError(f"column {c} is categorical but the reference holds non-integer values "
                                 f"(e.g. {col[col != np.round(col)][0]}): categorical columns hold integer codes")
            codes = np.unique(col)
            if len(codes) > MAX_CATEGORIES:
                raise ValueError(f"categorical column {c} has {len(codes)} distinct codes in the reference; at most "
                                 f"{MAX_CATEGORIES} can be one-hot encoded: treat it as numeric")
            categories.append(codes.astype(np.float32))
        self.mean, self.std, self.categories = mean.astype(np.float32), std.astype(np.float32), categories
        self.fitted_latent = latent_width(self._model_inputs(x_ref))

    def _ranges_of(self, x_ref: Array) -> ranges.FeatureRanges:
        """Numeric columns: the reference's range each. Code columns are not range-checked (an unseen
        code is a change in the distribution, which the encoding makes visible) but must be integers."""
        return ranges.learn_ranges(x_ref, margin=self.range_margin, unchecked=self.categorical,
                                   integer_columns=self.categorical)

    def _copy_scale(self, x: Array) -> NDArray[np.float64]:
        """Numeric columns: their standard deviation; code columns are keys: rows with different codes are
        never near-copies (another machine type is another input, however close its readings)."""
        scale = super()._copy_scale(x)
        scale[list(self.categorical)] = copies.KEY
        return scale

    def encoded_width(self) -> int:
        """Columns after encoding: the numeric ones plus one per category seen in the reference."""
        if self.mean is None:
            raise ValueError(f"{self.name}: the input encoding is learnt in fit()")
        return len(self.numeric) + sum(len(c) for c in self.categories)

    def _model_inputs(self, x: Array) -> Array:
        if self.mean is None or self.std is None:
            raise ValueError(f"{self.name}: the input encoding is learnt in fit()")
        parts = [np.clip((x[:, list(self.numeric)] - self.mean) / self.std, -CLIP, CLIP)]
        for c, codes in zip(self.categorical, self.categories, strict=True):
            parts.append(x[:, c : c + 1] == codes[None, :])  # unseen code: all zeros
        return np.concatenate(parts, axis=1, dtype=np.float32)

    def _code_groups(self) -> list[list[int]]:
        """Each categorical column's one-hot columns, after the numeric ones (`_model_inputs`)."""
        out, start = [], len(self.numeric)
        for codes in self.categories:
            out.append(list(range(start, start + len(codes))))
            start += len(codes)
        return out

    def _input_column(self, encoded: int) -> int:
        """The row column an encoded column comes from (numeric columns first, then each code's one-hot)."""
        if encoded < len(self.numeric):
            return self.numeric[encoded]
        encoded -= len(self.numeric)
        for c, codes in zip(self.categorical, self.categories, strict=True):
            if encoded < len(codes):
                return c
            encoded -= len(codes)
        raise IndexError(encoded)

    def _build_model(self) -> DenseAutoencoder:
        width = self.encoded_width()
        return DenseAutoencoder(width, hidden=self.hidden or hidden_width(width),
                                latent_dim=self.latent_dim or self.fitted_latent or 1)

    def _input_state(self) -> dict[str, NDArray[Any]]:
        assert self.mean is not None and self.std is not None
        return {"mean": self.mean, "std": self.std, "fitted_latent": np.asarray(self.fitted_latent or 0),
                **{f"categories_{c}": codes for c, codes in zip(self.categorical, self.categories, strict=True)}}

    def _restore_inputs(self, arrays: dict[str, NDArray[Any]]) -> None:
        self.mean = arrays["mean"].astype(np.float32)
        self.std = arrays["std"].astype(np.float32)
        self.categories = [arrays[f"categories_{c}"].astype(np.float32) for c in self.categorical]
        self.fitted_latent = int(arrays["fitted_latent"]) or None

    # -- description ----------------------------------------------------------------------------
    def schema(self) -> dict[str, Any]:
        return {"kind": self.kind, "n_features": self.n_features, "categorical": list(self.categorical),
                "image_shape": []}

    def config(self) -> dict[str, Any]:
        return {**super().config(), "n_features": self.n_features, "categorical": list(self.categorical),
                "hidden": self.hidden, "latent_dim": self.latent_dim}
