"""Moment-matched synthetic drift (scanflow.drift.adapt): pure functions, no processes."""

from __future__ import annotations

import numpy as np
import pytest

from scanflow.drift.adapt import FeatureAffine, fit_feature_affine, moment_matched_copies


def _clean(n: int = 400, d: int = 6, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0.0, 1.0, size=(n, d))


def test_a_gain_offset_drift_is_recovered_from_other_rows_of_the_drifted_domain() -> None:
    """The map is fitted on DIFFERENT rows than it is applied to, as in a retrain: the drifted rows
    are critical points, the copies are of the clean training rows."""
    clean, other = _clean(seed=0), _clean(seed=1)
    gain, offset = np.array([0.4, 0.4, 1.0, 2.0, 0.0, 0.5]), np.array([0.3, 0.3, 0.0, -0.5, 0.7, 0.1])
    drifted = other * gain + offset
    affine = fit_feature_affine(clean, drifted)
    assert affine.gain == pytest.approx(gain, abs=0.08)
    assert affine.offset == pytest.approx(offset, abs=0.05)
    copies = moment_matched_copies(clean, drifted)
    assert copies.dtype == np.float32 and copies.shape == clean.shape
    assert copies == pytest.approx(clean * gain + offset, abs=0.06)  # each copy is ITS row, drifted


def test_copies_match_the_target_moments_and_respect_bounds() -> None:
    clean = _clean()
    target = np.random.default_rng(2).normal(0.5, 0.05, size=(50, 6))
    copies = moment_matched_copies(clean, target, bounds=(0.0, 1.0))
    assert copies.mean(axis=0) == pytest.approx(target.mean(axis=0), abs=1e-3)
    assert copies.std(axis=0) == pytest.approx(target.std(axis=0), rel=0.02)
    wide = moment_matched_copies(clean, target * 40 - 20, bounds=(0.0, 1.0))
    assert wide.min() >= 0.0 and wide.max() <= 1.0


def test_a_feature_constant_in_the_clean_rows_gets_the_target_mean_and_spread_as_noise() -> None:
    """A border pixel that is always 0 on clean scans and 0.3 +- 0.02 on the new scanner: an affine map
    of a constant cannot spread, so the copies draw the target's spread as noise (seeded)."""
    clean = _clean()
    clean[:, 0] = 0.0
    target = _clean(seed=3) * 0.4 + 0.3
    target[:, 0] = np.random.default_rng(4).normal(0.3, 0.02, size=len(target))
    a, b = moment_matched_copies(clean, target, rng=7), moment_matched_copies(clean, target, rng=7)
    assert np.array_equal(a, b)  # deterministic for a seed
    assert a[:, 0].mean() == pytest.approx(0.3, abs=0.005) and a[:, 0].std() == pytest.approx(0.02, rel=0.2)
    assert fit_feature_affine(clean, target).noise_std[1:] == pytest.approx(0.0)


@pytest.mark.parametrize(("source", "target", "message"), [
    (np.zeros((10, 3)), np.zeros((10, 4)), "features"),
    (np.zeros((10, 3)), np.zeros((1, 3)), "at least 2"),
    (np.zeros(10), np.zeros((10, 1)), "2-D"),
    (np.zeros((10, 3)), np.full((4, 3), np.nan), "NaN"),
])
def test_bad_input_gets_a_clear_error(source: np.ndarray, target: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        moment_matched_copies(source, target)


def test_apply_refuses_rows_of_another_width() -> None:
    affine = FeatureAffine(gain=np.ones(3), offset=np.zeros(3), noise_std=np.zeros(3))
    with pytest.raises(ValueError, match="fitted on 3"):
        affine.apply(np.zeros((2, 4)))


def test_class_balanced_moments_do_not_read_a_skewed_class_mix_as_drift() -> None:
    """No drift at all, but the target rows are mostly of one class (a detector's skewed picks): plain
    moments see a shift; class-balanced moments over the shared classes see the identity map."""
    gen = np.random.default_rng(0)
    centres = np.array([[0.2, 0.8], [0.8, 0.2], [0.5, 0.5]])
    ys = np.repeat([0, 1, 2], 200)
    source = centres[ys] + gen.normal(0, 0.05, size=(600, 2))
    yt = np.array([0] * 90 + [1] * 10)  # class 2 absent, class 0 over-represented
    target = centres[yt] + gen.normal(0, 0.05, size=(100, 2))
    plain = fit_feature_affine(source, target)
    balanced = fit_feature_affine(source, target, source_labels=ys, target_labels=yt)
    assert abs(plain.offset).max() > 0.1  # the class mix read as drift
    assert balanced.gain == pytest.approx([1.0, 1.0], abs=0.1)
    assert balanced.offset == pytest.approx([0.0, 0.0], abs=0.06)


def test_labels_must_come_in_pairs_and_match_the_rows() -> None:
    x = _clean(20, 3)
    with pytest.raises(ValueError, match="both"):
        fit_feature_affine(x, x, source_labels=np.zeros(20))
    with pytest.raises(ValueError, match="one entry per row"):
        fit_feature_affine(x, x, source_labels=np.zeros(19), target_labels=np.zeros(20))
    with pytest.raises(ValueError, match="too few"):
        fit_feature_affine(x, x, source_labels=np.zeros(20), target_labels=np.ones(20))
