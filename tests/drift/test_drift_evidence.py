"""The combined window test (scanflow/drift/evidence.py): its rate under the null, its power on a change only
one column shows, and the detector's use of it (a change along the data the reconstruction errors miss)."""

from __future__ import annotations

import numpy as np
import pytest
from scanflow.examples.digits.data import Splits
from scanflow.examples.sensors import data as sensors

from scanflow.drift import AutoencoderDriftDetector, TabularAutoencoderDriftDetector, evidence, feature_ks


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


def test_share_scores_hold_their_tail_where_the_normal_approximation_does_not() -> None:
    """2 expected events in 100 rows (and 3 in 30): the share's mid-p normal score exceeds 3.09 (one-sided
    0.001, where the window test decides) at its rate and lower levels at most 1.6 times theirs; the plain
    z of the share exceeds 3.09 several times too often."""
    rng = np.random.default_rng(0)
    for n, p0 in ((100, 0.02), (30, 0.1), (500, 0.05)):
        shares = rng.binomial(n, p0, size=200_000) / n
        scored = evidence.share_z(shares, n, np.full(len(shares), p0))
        for level, cut, slack in ((0.05, 1.645, 1.6), (0.01, 2.326, 1.6), (0.001, 3.09, 1.2)):
            assert np.mean(scored > cut) <= level * slack, (n, p0, level)
    n, p0 = 100, 0.02
    shares = rng.binomial(n, p0, size=200_000) / n
    plain = (shares - p0) / np.sqrt(p0 * (1 - p0) / n)
    assert np.mean(plain > 3.09) >= 3 * 0.001
    assert evidence.share_z(np.array([0.0, 0.02]), n, np.array([p0, p0])).tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="one-sided"):
        evidence.Layout.of([("a", 2)], shares=[1])


def test_the_detector_sees_a_change_along_the_data(detector: AutoencoderDriftDetector, splits: Splits) -> None:
    """A mild contrast change (pixels 10 % closer to grey) reconstructs as well as clean digits: the errors
    alone (the rule before) miss most such windows; the input family catches them. Clean windows pass.
    Windows are fresh rows (drawn without replacement): rows resampled with replacement from a 629-row
    pool are a sample of that pool, whose own difference from the population the per-feature KS test
    rightly sees (3 of 10 such windows flagged; 0.5 % of 200 fresh-row windows on this detector)."""
    rng = np.random.default_rng(3)
    pool = np.concatenate([splits.x_test, splits.x_feedback])
    ours, errors_only, clean = [], [], []
    for _ in range(10):
        x = pool[rng.permutation(len(pool))[:300]]
        clean.append(detector.predict(x).is_drift)
        rep = detector.predict(0.5 + 0.9 * (x - 0.5))
        ours.append(rep.is_drift)
        errors_only.append(min(1.0, 2 * min(rep.metadata["p_location"], rep.metadata["p_scale"])) < detector.fpr)
        assert set(rep.metadata["evidence_p"]) == {"errors", "inputs", "latent", "input_mean", "error_tail",
                                                   "feature_ks"}
        # the window's p: Bonferroni over the joint z-test and the per-feature KS test
        assert rep.p_value == min(1.0, 2 * min(rep.metadata["p_joint"], rep.metadata["p_feature_ks"]))
    assert np.mean(ours) >= 0.9 and np.mean(ours) > np.mean(errors_only)
    assert np.mean(clean) <= 0.2
    assert rep.metadata["shifted_inputs"] and all(0 <= s["column"] < 64 for s in rep.metadata["shifted_inputs"])


def test_the_error_tail_sees_a_few_rows_hit_hard(detector: AutoencoderDriftDetector, splits: Splits) -> None:
    """A 3x3 patch blanked in one image of ten: the mean and spread of a window's errors barely move (the
    errors-only rule flagged none of these windows), but its share of rows above the calibration's upper
    error quantiles does (the "error_tail" family). Clean windows of the same fresh rows rarely reach it."""
    rng = np.random.default_rng(4)
    pool = np.concatenate([splits.x_test, splits.x_feedback])
    tail_p: dict[bool, list[float]] = {False: [], True: []}
    flagged, errors_only = [], []
    for hit in (False, True):
        for _ in range(10):
            x = pool[rng.permutation(len(pool))[:300]].copy()
            images = x.reshape(-1, 8, 8)  # a view: the patches land in x
            for i in np.flatnonzero(rng.random(len(x)) < (0.1 if hit else 0.0)):
                r, c = rng.integers(0, 6, 2)
                images[i, r:r + 3, c:c + 3] = 0.0
            rep = detector.predict(x)
            tail_p[hit].append(rep.metadata["evidence_p"]["error_tail"])
            if hit:
                flagged.append(rep.is_drift)
                errors_only.append(min(1.0, 2 * min(rep.metadata["p_location"], rep.metadata["p_scale"])) < detector.fpr)
    # seen: the tail family at p < 0.05 in 6 of 10 windows, 0 of 10 clean; the window flagged in 3 of
    # 10 (its level is the min over every family and the KS test), the errors-only rule in none
    assert np.mean(np.array(tail_p[True]) < 0.05) >= 0.5
    assert np.mean(np.array(tail_p[False]) < 0.05) <= 0.2
    assert np.mean(flagged) > np.mean(errors_only) and np.mean(errors_only) <= 0.1


def test_a_change_every_pixel_shares_shows_in_the_mean_input(detector: AutoencoderDriftDetector,
                                                             splits: Splits) -> None:
    """A mild new tone curve (x ** 0.85: grey ink a little darker, the benchmark's mildest) moves every inked
    pixel a little the same way. Each pixel's evidence is weighed against a bar that rises with the number of
    pixels; the image's mean intensity (the "input_mean" family) adds them up. Seen: the family at p <= 2.5e-4
    in every toned window, below the best per-pixel p (mean, spread or KS) in 9 of 10; clean windows of the
    same fresh rows at p >= 0.5."""
    rng = np.random.default_rng(5)
    pool = np.concatenate([splits.x_test, splits.x_feedback])
    family_p: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for toned in (False, True):
        for _ in range(10):
            x = pool[rng.permutation(len(pool))[:200]]
            family_p[toned].append(detector.predict(x ** 0.85 if toned else x).metadata["evidence_p"])
    mean_p = {k: np.array([p["input_mean"] for p in v]) for k, v in family_p.items()}
    per_pixel = np.array([min(p["inputs"], p["feature_ks"]) for p in family_p[True]])
    assert np.mean(mean_p[True] < 0.01) >= 0.8, mean_p[True]
    assert np.mean(mean_p[True] < per_pixel) >= 0.8, (mean_p[True], per_pixel)
    assert np.mean(mean_p[False] < 0.05) <= 0.2, mean_p[False]


def test_a_table_has_no_mean_input_family() -> None:
    """A mean over unrelated standardised columns is no quantity: tables keep the families before."""
    x_train, _ = sensors.generate(600, 0)
    x_cal, _ = sensors.generate(400, 1)
    det = TabularAutoencoderDriftDetector(sensors.N_FEATURES, categorical=sensors.CATEGORICAL, epochs=2,
                                          num_threads=1).fit(x_train, x_cal)
    assert set(det.predict(sensors.generate(200, 2)[0]).metadata["evidence_p"]) == {
        "errors", "inputs", "latent", "error_tail", "feature_ks"}


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


# -- the per-feature KS test ------------------------------------------------------------------------------
def test_feature_ks_statistics_and_p_values_are_scipys() -> None:
    """Same D and (asymptotic) p as scipy's ks_2samp per column, ties and a constant column included."""
    from scipy.stats import ks_2samp

    rng = np.random.default_rng(1)
    cal = np.round(rng.normal(size=(450, 6)) * 2) / 2  # heavy ties
    cal[:, 3] = 0.0
    win = np.round(rng.normal(size=(200, 6)) * 2) / 2 + 0.1
    win[:7, 3] = 1.0
    ks = feature_ks.FeatureKS.fit(cal)
    d = ks.statistics(win)
    ref = [ks_2samp(cal[:, j], win[:, j], method="asymp") for j in range(6)]
    assert d == pytest.approx([r.statistic for r in ref], abs=1e-12)
    assert ks.p_values(d, 200) == pytest.approx([r.pvalue for r in ref], rel=1e-9)
    # far beyond every null draw the window's p is the Bonferroni bound over the columns' p-values
    bound = min(1.0, 6 * min(r.pvalue for r in ref))
    assert bound < 1e-4 and ks.test(win)[1] == pytest.approx(bound, rel=1e-9)


def test_feature_ks_joint_null_is_kolmogorovs_for_one_continuous_column() -> None:
    """The multiplier bootstrap's 95 % point for one continuous column is the Kolmogorov
    distribution's (1.358): the null is the supremum of a Brownian bridge, as it should be. (Statistics
    are divided by that constant, a continuous column's scale; balanced as a code column, the column's
    own 95 % point is the same.)"""
    x = np.random.default_rng(4).normal(size=(1000, 1))
    ks = feature_ks.FeatureKS.fit(x, draws=4000)
    assert ks.scale[0] == feature_ks.KOLMOGOROV_95
    assert np.quantile(ks.max_null * ks.scale[0], 0.95) == pytest.approx(1.358, abs=0.06)
    assert feature_ks.FeatureKS.fit(x, codes=[[0]], draws=4000).scale[0] == pytest.approx(1.358, abs=0.06)


def test_feature_ks_balances_a_categorical_input_and_counts_it_as_one_column() -> None:
    """A categorical input one-hot encoded in 4 columns (shares 35/25/25/15 %) beside 9 continuous ones.
    A 0/1 column has one CDF jump, so its null supremum is |N(0, p (1 - p))| (95 % point 1.96
    sqrt(p (1 - p)) = 0.70 at p = 0.15), half a continuous column's 1.36: each code column's scale says so.
    A category mix that takes the last code from 15 % to 25 % of 200-row windows (4 of its own null sd) is
    caught, where the raw maximum, whose bar the continuous columns set, misses most such windows. The 4
    codes count as one column: a shift of one continuous column keeps the level it would have beside 9
    other columns, more than if each code were a column of its own."""
    rng = np.random.default_rng(6)
    shares = np.array([0.35, 0.25, 0.25, 0.15])

    def rows(n: int, p: np.ndarray = shares, shift: float = 0.0) -> np.ndarray:
        codes = np.eye(4)[rng.choice(4, n, p=p)]
        x = rng.normal(size=(n, 9))
        x[:, 0] += shift
        return np.concatenate([x, codes], axis=1)

    cal = rows(1350)
    group = [[9, 10, 11, 12]]
    ks, unbalanced = feature_ks.FeatureKS.fit(cal, codes=group), feature_ks.FeatureKS.fit(cal)
    each = feature_ks.FeatureKS.fit(cal, codes=[[9], [10], [11], [12]])  # every code a column of its own
    assert ks.scale[12] == pytest.approx(1.96 * np.sqrt(0.15 * 0.85), rel=0.1)
    assert np.all(ks.scale[:9] == feature_ks.KOLMOGOROV_95)
    mixed = np.append(shares[:3] * 0.75 / 0.85, 0.25)  # the last code +10 points, the others in proportion
    caught = raw = 0
    for _ in range(40):
        win = rows(200, mixed)
        caught += ks.test(win)[1] < 0.05
        raw += unbalanced.test(win)[1] < 0.05
    assert caught >= 20 and caught >= 2 * raw, (caught, raw)
    # the rate holds, over deployments (one calibration set's own error moves its rate: 0.04-0.08 here)
    clean = 0
    for _ in range(5):
        fresh = feature_ks.FeatureKS.fit(rows(1350), codes=group, draws=1000)
        clean += sum(fresh.test(rows(200))[1] < 0.05 for _ in range(100))
    assert clean <= 500 * (0.05 + 3 * np.sqrt(0.05 * 0.95 / 500)), clean
    grouped = separate = 0
    for _ in range(60):
        win = rows(200, shift=0.3)
        grouped += ks.test(win)[1] < 0.05
        separate += each.test(win)[1] < 0.05
    assert grouped > separate, (grouped, separate)
    with pytest.raises(ValueError, match="disjoint column indices"):
        feature_ks.FeatureKS.fit(cal, codes=[[9, 10], [10, 11]])


def test_feature_ks_rate_under_the_null_is_the_stated_one() -> None:
    """20 correlated columns, two of them on a coarse grid (ties): the joint null holds the rate
    (0.05 +- 3 binomial sd of 400 windows) where Bonferroni over the columns falls well under it."""
    rng = np.random.default_rng(2)

    def rows(n: int) -> np.ndarray:
        x = rng.normal(size=(n, 20)) + 1.5 * rng.normal(size=(n, 1))
        x[:, :2] = np.round(x[:, :2])
        return x

    ks = feature_ks.FeatureKS.fit(rows(1000))
    joint, bonferroni = [], []
    for _ in range(400):
        d, p = ks.test(rows(200))
        joint.append(p)
        bonferroni.append(min(1.0, 20 * float(ks.p_values(d, 200).min())))
    se = 3 * np.sqrt(0.05 * 0.95 / 400)
    assert 0.05 - se <= float(np.mean(np.array(joint) < 0.05)) <= 0.05 + se
    assert float(np.mean(np.array(bonferroni) < 0.05)) < float(np.mean(np.array(joint) < 0.05))


def test_feature_ks_sees_a_sparse_change_of_shape_the_moments_miss() -> None:
    """One column of 20, a bimodal mixture of two narrow modes, moved by 0.05 of its overall sd: its
    mean barely moves against the overall variance (the joint z-test's view), its CDF moves a lot
    at the steep modes. And a point mass at 0 that mild noise half empties (an un-inked pixel)."""
    rng = np.random.default_rng(3)

    def rows(n: int) -> np.ndarray:
        x = rng.normal(size=(n, 20))
        x[:, 5] = rng.choice([-1.0, 1.0], n) + 0.02 * rng.normal(size=n)  # overall sd ~1, modes sd 0.02
        x[:, 9] = np.where(rng.random(n) < 0.8, 0.0, rng.random(n))  # 80 % exactly 0
        return x

    cal = rows(1000)
    ks = feature_ks.FeatureKS.fit(cal)
    null = _null(np.concatenate([cal, np.abs(cal - np.median(cal, axis=0))], axis=1))
    shifted, noisy = rows(200), rows(200)
    shifted[:, 5] += 0.05
    noisy[:, 9] = np.clip(noisy[:, 9] + 0.03 * rng.normal(size=200), 0.0, None)
    for win in (shifted, noisy):
        assert ks.test(win)[1] < 1e-3
        joint = null.test(np.concatenate([win, np.abs(win - np.median(cal, axis=0))], axis=1), 0.0).p_value
        assert joint > 0.01  # what the moments alone say: not drift


def test_feature_ks_refuses_a_window_of_another_width() -> None:
    ks = feature_ks.FeatureKS.fit(np.zeros((10, 3)))
    with pytest.raises(ValueError, match="columns"):
        ks.statistics(np.zeros((5, 4)))


def test_pair_null_holds_the_rate_and_spends_what_bonferroni_leaves() -> None:
    """The joint z-test and the feature KS test read the same rows: on correlated columns their p-values
    are dependent under the null, so Bonferroni over the two falls under its level. The min-p calibrated
    on their coupled null (feature_ks.PairNull) holds it (0.05 +- 3 binomial sd of 400 fresh windows)."""
    rng = np.random.default_rng(5)

    def rows(n: int) -> np.ndarray:
        return rng.normal(size=(n, 10)) + 1.5 * rng.normal(size=(n, 1))

    def values(x: np.ndarray, med: np.ndarray) -> np.ndarray:
        return np.concatenate([x, np.abs(x - med)], axis=1)

    cal = rows(4000)  # a large calibration set: its own error is small against a 200-row window's
    med = np.median(cal, axis=0)
    null, ks = _null(values(cal, med)), feature_ks.FeatureKS.fit(cal)
    pair = feature_ks.PairNull.fit(values(cal, med), cal, null, ks, draws=2000)
    p_pair, p_bonf = [], []
    for _ in range(400):
        win = rows(200)
        p_joint, p_ks = null.test(values(win, med), 0.0).p_value, ks.test(win)[1]
        p_pair.append(pair.p_value(p_joint, p_ks))
        p_bonf.append(min(1.0, 2 * min(p_joint, p_ks)))
    se = 3 * np.sqrt(0.05 * 0.95 / 400)
    rate = float(np.mean(np.array(p_pair) < 0.05))
    assert 0.05 - se <= rate <= 0.05 + se, rate
    assert float(np.mean(np.array(p_bonf) < 0.05)) < rate
    # the level each test gets: above Bonferroni's half
    assert float(np.quantile(pair.minp_null, 0.05)) > 0.025
    # beyond every null draw the Bonferroni bound says how far beyond
    assert pair.p_value(1e-9, 0.5) == pytest.approx(2e-9)
