"""The combined window test (scanflow/drift/evidence.py): its rate under the null, its power on a change only
one column shows, and the detector's use of it (a change along the data the reconstruction errors miss)."""

from __future__ import annotations

import numpy as np
import pytest

from scanflow.drift import AutoencoderDriftDetector, evidence
from workflows.digits.data import Splits


def _null(values: np.ndarray) -> evidence.CombinedNull:
    layout = evidence.Layout.of([("a", 2), ("b", values.shape[1] - 2)])
    return evidence.CombinedNull.fit(values, layout, draws=4000, seed=0)


def test_rate_under_the_null_is_the_stated_one_and_a_one_column_shift_is_caught() -> None:
    rng = np.random.default_rng(0)
    # 30 correlated columns (a shared factor): Bonferroni would be conservative, the joint null is not
    def rows(n: int) -> np.ndarray:
        return rng.normal(size=(n, 30)) + rng.normal(size=(n, 1))

    population = rows(200_000)
    null = _null(population[:20_000])  # a large calibration set: its own error is negligible here
    p = np.array([null.test(population[rng.integers(0, len(population), 200)], 0.0).p_value for _ in range(600)])
    rate = float(np.mean(p < 0.05))
    assert 0.025 <= rate <= 0.08, rate  # 0.05 +- 3 binomial sd of 600 windows
    shifted = rows(200)
    shifted[:, 7] += 0.4  # one column of 30, 0.4 sd
    ev = null.test(shifted, 0.0)
    assert ev.p_value < 0.01 and ev.family_p["b"] < ev.family_p["a"]
    assert int(np.argmax(np.abs(ev.z))) == 7


def test_a_constant_calibration_column_stays_testable() -> None:
    """A pixel 0 in every calibration row: one clean row inking it must not read as infinite drift."""
    rng = np.random.default_rng(1)
    cal = rng.normal(size=(450, 4))
    cal[:, 3] = 0.0
    null = _null(cal)
    window = rng.normal(size=(200, 4))
    window[:, 3] = 0.0
    window[0, 3] = 0.5
    assert null.test(window, 0.0).p_value > 0.05
    window[:, 3] = 0.3  # every row inked: a change
    assert null.test(window, 0.0).p_value < 0.001


def test_min_window_rises_with_a_far_tail() -> None:
    rng = np.random.default_rng(2)
    normal = rng.normal(size=(1000, 4))
    tailed = normal + np.where(rng.random((1000, 1)) < 0.01, 10.0, 0.0)
    sizes = (2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 30, 50)
    assert evidence.min_window(_null(normal), normal, 0.05, sizes=sizes, draws=1000) <= 5
    assert evidence.min_window(_null(tailed), tailed, 0.05, sizes=sizes, draws=1000) >= 8


def test_the_detector_sees_a_change_along_the_data(detector: AutoencoderDriftDetector, splits: Splits) -> None:
    """A mild contrast change (pixels 10 % closer to grey) reconstructs as well as clean digits: the errors
    alone (the rule before) miss most such windows; the input family catches them. Clean windows pass."""
    rng = np.random.default_rng(3)
    pool = np.concatenate([splits.x_test, splits.x_feedback])
    ours, errors_only, clean = [], [], []
    for _ in range(10):
        x = pool[rng.integers(0, len(pool), 300)]
        clean.append(detector.predict(x).is_drift)
        rep = detector.predict(0.5 + 0.9 * (x - 0.5))
        ours.append(rep.is_drift)
        errors_only.append(min(1.0, 2 * min(rep.metadata["p_location"], rep.metadata["p_scale"])) < detector.fpr)
        assert set(rep.metadata["evidence_p"]) == {"errors", "inputs", "latent"}
    assert np.mean(ours) >= 0.9 and np.mean(ours) > np.mean(errors_only)
    assert np.mean(clean) <= 0.2
    assert rep.metadata["shifted_inputs"] and all(0 <= s["column"] < 64 for s in rep.metadata["shifted_inputs"])


def test_errors_only_evidence_is_the_rule_before(splits: Splits) -> None:
    det = AutoencoderDriftDetector(seed=0, epochs=5, num_threads=1, evidence="errors").fit(
        splits.x_train, splits.x_calibration)
    assert det.combined is None and det.metadata()["evidence"] == "errors"
    rep = det.predict(splits.x_test[:200])
    assert "evidence_p" not in rep.metadata
    assert rep.p_value == min(1.0, 2 * min(rep.metadata["p_location"], rep.metadata["p_scale"]))


def test_ecdf_cuts_skip_quantiles_every_calibration_value_is_under() -> None:
    x = np.zeros((100, 3))
    x[:10, 1] = 1.0  # a sparse column: every quartile is 0, 0.9 of the values at or below it
    x[:, 2] = np.arange(100)
    cols, thr = evidence.ecdf_cuts(x)
    assert 0 not in cols  # a constant column has no cut strictly inside (0, 1)
    assert list(thr[cols == 1]) == [0.0]
    assert list(thr[cols == 2]) == pytest.approx([24.75, 49.5, 74.25])
