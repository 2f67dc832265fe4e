"""Synthetic drifted copies of labelled clean rows, by matching per-feature moments (pure numpy).

Why: after drift a retrain gets only the few labelled drifted rows the feedback set holds for the
critical points (~100 distinct digits in S1), against ~1,000 clean training rows. Trained on that mix,
a model's accuracy on new drifted inputs depended mostly on WHICH ~100 rows it got (the detector's
class skew, the holdout draw, the seed: 1 to 7 points lost on unseen drifted digits, docs/benchmarks/s1-retrain.md).
The unlabelled side of the drift is cheap, though: the drifted inputs themselves say how each feature
moved. Fitting, per feature, the affine map that carries the clean rows' mean and standard deviation to
the drifted rows' (`fit_feature_affine`) and applying it to every clean training row gives as many
drifted-looking rows as there are clean ones, with their true labels (`moment_matched_copies`).

This is the simplest member of the moment-matching family of unsupervised domain adaptation (CORAL
aligns full covariances; AdaBN re-estimates normalisation statistics): it is exact for a per-feature
gain/offset drift (a washed-out or brighter sensor, a dead column) and roughly right for added noise;
it cannot express a geometric drift (rotation, shift), where it leaves the rows near their clean
selves. The promotion gate still judges the resulting model on held-out data, so a wrong fit costs a
refused challenger, not a worse champion. Measured offline on S1's scanner drift: docs/benchmarks/s1-retrain.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MIN_TARGET_ROWS = 2  # a standard deviation needs two rows; the gate catches a poor fit from few
_FLAT = 1e-3  # a source feature whose spread is below this is treated as constant


@dataclass(frozen=True)
class FeatureAffine:
    """Per-feature x -> gain * x + offset, plus Gaussian noise of `noise_std` on features that are
    constant in the source (an affine map cannot give them the target's spread)."""

    gain: np.ndarray
    offset: np.ndarray
    noise_std: np.ndarray

    def apply(self, x: np.ndarray, rng: np.random.Generator | int | None = 0,
              bounds: tuple[float, float] | None = None) -> np.ndarray:
        """The mapped copy of `x` (n, d) as float32; clipped to `bounds` when given (pixel ranges)."""
        x = _matrix(x, "x")
        if x.shape[1] != self.gain.shape[0]:
            raise ValueError(f"x has {x.shape[1]} features, the map was fitted on {self.gain.shape[0]}")
        out = x * self.gain + self.offset
        if np.any(self.noise_std > 0):
            gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
            out = out + gen.normal(0.0, 1.0, size=out.shape) * self.noise_std
        if bounds is not None:
            out = np.clip(out, bounds[0], bounds[1])
        return out.astype(np.float32)


def fit_feature_affine(source: np.ndarray, target: np.ndarray, *, source_labels: np.ndarray | None = None,
                       target_labels: np.ndarray | None = None) -> FeatureAffine:
    """The per-feature affine map carrying `source`'s mean and std onto `target`'s.

    Features constant in the source get gain 0, the target's mean as offset and the target's std as
    noise, so the copies match the target's first two moments on every feature.

    With both label arrays, the moments are class-balanced over the classes both sides hold (each such
    class weighs the same, rows of other classes none). Why: a pixel's mean depends on which digits
    are averaged, and the drifted rows are the detector's picks, whose class mix is skewed (one
    detector named digit 0 at half the others' rate); unweighted, that skew reads as drift. Offline,
    on the seeds whose detector skewed most, it cut the gap by 1-2 points (docs/benchmarks/s1-retrain.md)."""
    source, target = _matrix(source, "source"), _matrix(target, "target")
    if source.shape[1] != target.shape[1]:
        raise ValueError(f"source has {source.shape[1]} features, target {target.shape[1]}")
    if len(source) < 2 or len(target) < MIN_TARGET_ROWS:
        raise ValueError(f"need at least 2 source and {MIN_TARGET_ROWS} target rows, "
                         f"got {len(source)} and {len(target)}")
    w_s, w_t = _class_weights(source_labels, target_labels, len(source), len(target))
    mu_s, sd_s = _moments(source, w_s)
    mu_t, sd_t = _moments(target, w_t)
    flat = sd_s < _FLAT
    gain = np.where(flat, 0.0, sd_t / np.where(flat, 1.0, sd_s))
    offset = mu_t - gain * mu_s
    return FeatureAffine(gain=gain, offset=offset, noise_std=np.where(flat, sd_t, 0.0))


def moment_matched_copies(source: np.ndarray, target: np.ndarray, *, rng: np.random.Generator | int | None = 0,
                          bounds: tuple[float, float] | None = None, source_labels: np.ndarray | None = None,
                          target_labels: np.ndarray | None = None) -> np.ndarray:
    """One copy of every `source` row, mapped so each feature has `target`'s mean and std
    (class-balanced when both label arrays are given, see `fit_feature_affine`).

    The copies keep the source rows' labels: the map changes how a row looks, not what it shows."""
    affine = fit_feature_affine(source, target, source_labels=source_labels, target_labels=target_labels)
    return affine.apply(source, rng=rng, bounds=bounds)


def _class_weights(source_labels: np.ndarray | None, target_labels: np.ndarray | None, n_source: int,
                   n_target: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Row weights making each class both sides hold weigh the same (None, None: no labels, equal rows)."""
    if source_labels is None and target_labels is None:
        return None, None
    if source_labels is None or target_labels is None:
        raise ValueError("give both source_labels and target_labels, or neither")
    ys, yt = np.asarray(source_labels).ravel(), np.asarray(target_labels).ravel()
    if len(ys) != n_source or len(yt) != n_target:
        raise ValueError(f"labels must have one entry per row: {len(ys)} for {n_source} source rows, "
                         f"{len(yt)} for {n_target} target rows")
    shared = np.intersect1d(ys, yt)
    weights = []
    for y in (ys, yt):
        w = np.zeros(len(y))
        for c in shared:
            mask = y == c
            w[mask] = 1.0 / mask.sum()
        weights.append(w)
    if (weights[0] > 0).sum() < 2 or (weights[1] > 0).sum() < MIN_TARGET_ROWS:
        raise ValueError("source and target share too few labelled rows of common classes")
    return weights[0], weights[1]


def _moments(x: np.ndarray, w: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    if w is None:
        return x.mean(axis=0), x.std(axis=0)
    mu = np.average(x, axis=0, weights=w)
    return mu, np.sqrt(np.average((x - mu) ** 2, axis=0, weights=w))


def _matrix(x: np.ndarray, name: str) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array (rows, features), got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} holds NaN or infinite values")
    return arr
