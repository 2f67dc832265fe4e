"""scanflow/drift/stats.py: the pure decision functions."""

from __future__ import annotations

import numpy as np
import pytest

from scanflow.drift import stats


def test_welch_p_values_are_calibrated_under_the_null_and_small_under_a_shift() -> None:
    rng = np.random.default_rng(0)
    null = stats.NullStats.of(rng.normal(0.0, 1.0, 400))
    ps = [stats.welch_test(rng.normal(0.0, 1.0, 100), null)[1] for _ in range(400)]
    # null.mean is itself an estimate, so the fraction wobbles around 0.05 with this seed
    assert 0.01 < np.mean(np.asarray(ps) < 0.05) < 0.12
    t, p = stats.welch_test(rng.normal(0.5, 1.0, 100), null)
    assert t > 3 and p < 1e-3
    lower = rng.normal(-1.0, 1.0, 100)
    t, p = stats.welch_test(lower, null)  # two-sided: lower errors are drift too
    assert t < -3 and p < 1e-3
    t, p = stats.welch_test(lower, null, "greater")  # one-sided: they are not
    assert p > 0.9
    with pytest.raises(ValueError, match="alternative"):
        stats.welch_test(lower, null, "less")  # type: ignore[arg-type]


def test_error_threshold_and_critical_points() -> None:
    errors = np.arange(1, 101, dtype=np.float64)
    thr = stats.error_threshold(errors, 0.95)
    assert 95 <= thr <= 96
    assert list(stats.critical_points(np.array([1.0, 200.0, 50.0, 97.0]), thr)) == [1, 3]
    with pytest.raises(ValueError, match="not achievable"):
        stats.error_threshold(np.ones(10), 0.95)
    with pytest.raises(ValueError, match=r"in \(0, 1\)"):
        stats.error_threshold(errors, 1.0)


def test_log_errors_never_gives_minus_infinity() -> None:
    assert np.isfinite(stats.log_errors(np.array([0.0, 1e-12, 0.5]))).all()


def test_scale_test_catches_a_wider_spread_with_the_same_mean() -> None:
    rng = np.random.default_rng(1)
    cal = rng.normal(0.0, 1.0, 450)
    loc, scale = stats.NullStats.of(cal), stats.NullStats.of(stats.abs_deviations(cal))
    wide = rng.normal(0.0, 1.6, 200)
    _, t_scale, p_loc, p_scale = stats.welch_location_scale(wide, loc, scale)
    assert p_loc > 0.01 and p_scale < 1e-4 and t_scale > 0
    assert stats.bonferroni(p_loc, p_scale) == pytest.approx(2 * p_scale)
    assert stats.bonferroni(0.9, 0.8) == 1.0
