"""Per-deployment behaviour: the FPR of one fitted detector, the minimum window, schema violations, threads."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scanflow.examples.digits.data import Splits, corrupt, load_digits_scaled
from scanflow.examples.sensors import data as sensors

from scanflow.drift import AutoencoderDriftDetector, TabularAutoencoderDriftDetector, evidence, stats
from scanflow.drift import reconstruction as recon
from scanflow.drift.autoencoder import reconstruction_errors


# -- minimum window --------------------------------------------------------------------------------
def test_min_window_comes_from_the_calibration_errors_shape() -> None:
    rng = np.random.default_rng(0)
    normal = rng.normal(0.0, 1.0, 1000)
    # a rare far tail: 1% of calibration rows 10 sd out, so a small window holding one looks drifted
    tailed = np.where(rng.random(1000) < 0.01, 10.0, 0.0) + rng.normal(0.0, 1.0, 1000)
    mw_normal = stats.min_window(normal, stats.WindowNull.of(normal), 0.05)
    mw_tailed = stats.min_window(tailed, stats.WindowNull.of(tailed), 0.05)
    assert mw_normal <= 4  # means of normal values are normal at any n: nothing to refuse
    assert mw_tailed >= 8 > mw_normal
    null = stats.WindowNull.of(tailed)
    assert stats.resampled_fpr(tailed, null, 5, 0.05) > 0.07  # what refusing 5-row windows avoids
    assert stats.resampled_fpr(tailed, null, mw_tailed, 0.05) <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 3000)


def test_a_detector_refuses_windows_below_its_derived_minimum(detector: AutoencoderDriftDetector,
                                                               splits: Splits, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # the combined test's minimum is resampled from the calibration's own rows (every evidence family)
    assert detector.combined is not None
    _, blocks = detector._scores(np.asarray(detector.x_cal))
    values = detector._values(blocks)  # every family: the blocks, their spreads, the error tail
    assert detector.min_window == evidence.min_window(detector.combined, values, detector.fpr,
                                                      sizes=stats.WINDOW_GRID, seed=detector.seed)
    # the errors-only rule's minimum rises with a far tail of the calibration errors
    det = AutoencoderDriftDetector.load(detector.save(tmp_path / "d"))  # a copy to recalibrate
    det.evidence = "errors"
    det.infer_threshold(splits.x_calibration)
    before = det.min_window
    # a calibration set with a few inverted digits (1 - x): a far right tail in its log errors
    cal = np.concatenate([splits.x_calibration[:441], 1.0 - splits.x_calibration[441:]])
    det.infer_threshold(cal)
    assert det.min_window is not None and det.calibration_errors is not None and before is not None
    log_errs = stats.log_errors(det.calibration_errors)
    assert det.min_window == stats.min_window(log_errs, stats.WindowNull.of(log_errs), det.fpr, seed=det.seed)
    assert det.min_window > before  # derived from the errors, not a constant
    m = det.min_window
    with pytest.raises(ValueError, match=rf"window of {m - 1} rows: this detector needs at least {m} \(its calibration\)"):
        det.predict(splits.x_test[: m - 1])
    rep = det.predict(splits.x_test[:m])
    assert rep.metadata["min_window"] == m and rep.to_dict()["metadata"]["min_window"] == m
    det.save(tmp_path / "d2")
    assert AutoencoderDriftDetector.load(tmp_path / "d2").min_window == m  # stored with the detector


# -- FPR per deployment ----------------------------------------------------------------------------
def test_fpr_per_deployment_over_20_reference_splits() -> None:
    """20 splits of digits, each a fresh autoencoder (5 epochs) and ONE calibration set (450 rows drawn
    from the split's held-out population); 40 fresh clean windows per split and window size, drawn from
    the same population. The decision is `stats.window_test` on the windows' errors, what `predict` does
    (without the torch pass per window, to stay well under a minute)."""
    torch.set_num_threads(1)
    x_all, _ = load_digits_scaled()
    per_split: dict[int, list[float]] = {200: [], 500: []}
    power: list[bool] = []
    for split in range(20):
        rng = np.random.default_rng(3000 + split)
        perm = rng.permutation(len(x_all))
        population = x_all[perm[720:]]
        cal = population[rng.integers(0, len(population), 450)]
        det = AutoencoderDriftDetector(epochs=5, seed=split, num_threads=1).fit(x_all[perm[:720]], cal)
        assert det.model is not None and det.window_null is not None
        pop_err = stats.log_errors(reconstruction_errors(det.model, population))
        noisy_err = stats.log_errors(reconstruction_errors(det.model, corrupt(population, "noise", 2, rng)))
        for w, flags in per_split.items():
            hits = []
            for _ in range(40):
                _, _, p_loc, p_sc = stats.window_test(pop_err[rng.integers(0, len(pop_err), w)],
                                                      det.window_null, det.margin)
                hits.append(stats.bonferroni(p_loc, p_sc) < det.fpr)
            flags.append(float(np.mean(hits)))
            _, _, p_loc, p_sc = stats.window_test(noisy_err[rng.integers(0, len(noisy_err), w)],
                                                  det.window_null, det.margin)
            power.append(stats.bonferroni(p_loc, p_sc) < det.fpr)
    for w, flags in per_split.items():
        # 0.15 of 40 is 6 flags; a deployment at the stated 0.05 reaches it with probability 0.014
        assert max(flags) <= 0.15, (w, flags)
        assert np.mean(flags) <= 0.05, (w, flags)
    assert np.mean(power) >= 0.95  # noise sigma 0.2 is still caught


# -- schema violations -----------------------------------------------------------------------------
def test_0_255_inputs_are_a_schema_violation_not_drift(detector: AutoencoderDriftDetector,
                                                       clean_pool: np.ndarray) -> None:
    window = clean_pool[:300]
    rep = detector.predict(window * 255.0)
    sv = rep.schema_violation
    assert sv is not None and sv["fraction_out"] > 0.99 and sv["max_excess"] > 200, sv
    assert not rep.is_drift and rep.metadata["tested"] is False and rep.to_dict()["schema_violation"] == sv
    # a few bad rows in a clean window: reported, left out, the rest tested as usual
    mixed = window.copy()
    mixed[:10] *= 255.0
    mixed[10, 3] = np.nan
    rep = detector.predict(mixed)
    assert rep.schema_violation is not None and rep.schema_violation["rows"] == 11
    assert rep.schema_violation["non_finite_rows"] == 1 and rep.metadata["tested_rows"] == 289
    assert rep.metadata["tested"] is True and rep.p_value > 1e-3
    assert np.isnan(rep.errors[10]) and 10 not in rep.critical_indices
    assert detector.predict(window).schema_violation is None


def test_tabular_units_and_codes_are_schema_violations() -> None:
    x_train, _ = sensors.generate(800, 0)
    x_cal, _ = sensors.generate(500, 1)
    det = TabularAutoencoderDriftDetector(sensors.N_FEATURES, categorical=sensors.CATEGORICAL, epochs=10,
                                          num_threads=1).fit(x_train, x_cal)
    window, _ = sensors.generate(300, 2)
    assert det.predict(window).schema_violation is None
    fahrenheit = window.copy()
    temp = sensors.FEATURE_NAMES.index("temperature_c")
    fahrenheit[:, temp] = fahrenheit[:, temp] * 1.8 + 32.0
    rep = det.predict(fahrenheit)
    sv = rep.schema_violation
    assert sv is not None and sv["columns"] == [temp] and sv["fraction_out"] > 0.5
    # other units are a drift to learn, not an off-scale input: reported AND tested (and flagged)
    assert sv["off_scale_rows"] == 0 and rep.metadata["tested_rows"] == 300 and rep.is_drift, sv
    codes = window.copy()
    codes[:5, 0] = 1.5
    sv = det.predict(codes).schema_violation
    assert sv is not None and sv["non_integer_columns"] == [0] and sv["rows"] == 5
    with pytest.raises(ValueError, match=r"mis-scaled .* columns \[" + str(temp) + r"\]"):
        TabularAutoencoderDriftDetector(sensors.N_FEATURES, categorical=sensors.CATEGORICAL, epochs=1).fit(
            x_train, np.where(np.arange(sensors.N_FEATURES) == temp, x_cal * 1.8 + 32.0, x_cal))


def test_a_mis_scaled_image_holdout_is_refused(splits: Splits) -> None:
    with pytest.raises(ValueError, match="mis-scaled"):
        AutoencoderDriftDetector(epochs=1).fit(splits.x_train, splits.x_calibration * 255.0)


# -- threads and Welch ----------------------------------------------------------------------------
def test_windows_up_to_1000_rows_score_on_one_thread(detector: AutoencoderDriftDetector,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    original = recon.errors_and_codes

    def spy(model, x):  # type: ignore[no-untyped-def]
        seen.append(torch.get_num_threads())
        return original(model, x)

    monkeypatch.setattr(recon, "errors_and_codes", spy)
    det = AutoencoderDriftDetector.__new__(AutoencoderDriftDetector)
    det.__dict__.update(detector.__dict__, num_threads=None)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        det.predict(np.zeros((1000, 64), dtype=np.float32))
        det.predict(np.zeros((1001, 64), dtype=np.float32))
    finally:
        torch.set_num_threads(before)
    assert seen == [1, 2]


def test_welch_from_scipy_matches_the_hand_written_formula() -> None:
    rng = np.random.default_rng(4)
    for _ in range(50):
        n, m = int(rng.integers(2, 300)), int(rng.integers(2, 600))
        w, c = rng.normal(rng.normal(), rng.uniform(0.2, 3), n), rng.normal(0, rng.uniform(0.2, 3), m)
        null = stats.NullStats.of(c)
        se_w, se_c = np.var(w, ddof=1) / n, null.var / m
        t = (np.mean(w) - null.mean) / math.sqrt(se_w + se_c)
        df = (se_w + se_c) ** 2 / (se_w**2 / (n - 1) + se_c**2 / (m - 1))
        from scipy.special import stdtr

        for alt, p in (("two-sided", 2 * stdtr(df, -abs(t))), ("greater", stdtr(df, -t))):
            t2, p2 = stats.welch_test(w, null, alt)  # type: ignore[arg-type]
            assert t2 == pytest.approx(t, rel=1e-9) and p2 == pytest.approx(p, rel=1e-7, abs=1e-300)
