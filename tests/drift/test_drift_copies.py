"""Near-copies: a reference of replayed rows keeps a null that fresh rows of the same distribution meet.

A team resamples a small table with jitter, or a serving reference replays traffic: 8 jittered copies of
180 distinct rows. Before, the calibration rows were copies of the training rows, the autoencoder had
memorised them, and every fresh window read as drift (40 of 40 on both kinds, seen). Now copies stay on
one side of the split, count once in effective sizes, and the detector still sees the drifts.
"""

from __future__ import annotations

import numpy as np
import pytest
from scanflow.examples.digits.data import corrupt, load_digits_scaled
from scanflow.examples.sensors import data as sensors

from scanflow.drift import copies, fit_reference, load_detector
from scanflow.tracking.reference import DataSchema, Reference

COPIES, DISTINCT, WINDOWS, FPR = 8, 180, 40, 0.05


def _reference(x: np.ndarray, schema: DataSchema, rng: np.random.Generator) -> Reference:
    """The team's reference: the resampled pool shuffled and cut 80/20 into rows and a labelled holdout
    (copies of one row land on both sides, as a random split of a resampled pool puts them)."""
    x = x[rng.permutation(len(x))]
    cut = int(0.8 * len(x))
    return Reference(schema=schema, x=x[:cut], x_holdout=x[cut:], y_holdout=np.zeros(len(x) - cut, np.int64))


def test_group_labels_effective_sizes_and_a_split_that_keeps_groups_whole() -> None:
    rng = np.random.default_rng(0)
    base = rng.normal(size=(50, 6))
    x = np.concatenate([base + rng.normal(0, 0.01, base.shape) for _ in range(4)])
    labels = copies.groups(x, 0.05, seed=1)
    assert labels.max() + 1 == 50  # each row's 4 copies, and nothing else, share a group
    assert len({tuple(np.flatnonzero(labels == g) % 50) for g in range(50)}) == 50
    assert copies.kish(labels) == pytest.approx(50.0)
    assert copies.kish(np.arange(10)) == 10.0
    held = copies.split_groups(labels, 0.35, seed=2)
    assert 0.3 < held.mean() < 0.45
    assert not set(labels[held]) & set(labels[~held])  # no group on both sides
    # keys (a category code) must match: the same readings under another code are another input
    coded = np.column_stack([np.repeat([0.0, 1.0], 100), np.tile(rng.normal(size=(100, 3)), (2, 1))])
    assert copies.groups(coded, 0.05, keys=np.array([True, False, False, False])).max() + 1 == 200
    assert copies.near_any(x[:3] + 0.001, base, 0.05).all()
    assert not copies.near_any(rng.normal(size=(3, 6)) + 5, base, 0.05).any()
    with pytest.raises(ValueError, match="tolerance"):
        copies.groups(x, -1.0)


def _flag_rate(det, windows: list[np.ndarray]) -> float:  # type: ignore[no-untyped-def]
    return float(np.mean([det.predict(w).is_drift for w in windows]))


@pytest.mark.slow
def test_images_from_eight_jittered_copies_meet_fresh_digits_and_see_the_drift(tmp_path) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(11)
    x_all, _ = load_digits_scaled()
    order = rng.permutation(len(x_all))
    base, pool = x_all[order[:DISTINCT]], x_all[order[DISTINCT:]]

    def jitter(a: np.ndarray) -> np.ndarray:  # a scanner's read noise, fresh per copy
        return np.clip(a + rng.normal(0.0, 0.014, a.shape), 0.0, 1.0).astype(np.float32)

    schema = DataSchema(kind="image", n_features=64, task="classification", image_shape=(8, 8))
    det = fit_reference(_reference(np.concatenate([jitter(base) for _ in range(COPIES)]), schema, rng), seed=11)
    meta = det.metadata()
    assert meta["reference_distinct"] == DISTINCT  # the detector found the copies
    assert meta["calibration_effective"] < 100 and meta["warnings"]  # and says the null is uncertain

    def fresh(n: int = 200) -> np.ndarray:
        return jitter(pool[rng.choice(len(pool), n, replace=False)])

    assert _flag_rate(det, [fresh() for _ in range(WINDOWS)]) <= 2 * FPR
    # the workflow's own drift and two of the data module's, each in every window
    for kind, severity in (("contrast", 1), ("noise", 2), ("rotation", 2)):
        drifted = [corrupt(pool[rng.choice(len(pool), 200, replace=False)], kind, severity, rng=rng) for _ in range(5)]
        assert _flag_rate(det, drifted) == 1.0, kind
    # a window replaying reference rows (their own copies) is not drift either: the autoencoder's families
    # judge only the rows it never trained on
    replay = det.x_ref[rng.choice(len(det.x_ref), 200, replace=False)]
    assert not det.predict(replay).is_drift
    # saved and loaded, the same null and verdicts
    back = load_detector(det.save(tmp_path / "det"))
    w = fresh()
    assert back.predict(w).p_value == pytest.approx(det.predict(w).p_value)
    assert back.metadata()["calibration_effective"] == meta["calibration_effective"]


@pytest.mark.slow
def test_tables_from_eight_jittered_copies_meet_fresh_readings_and_see_the_drift() -> None:
    rng = np.random.default_rng(12)
    base, _ = sensors.generate(DISTINCT, rng=rng)
    sd = base.std(axis=0)
    sd[list(sensors.CATEGORICAL)] = 0.0  # a category code is not jittered

    def jitter(a: np.ndarray) -> np.ndarray:  # resampled with 2 % of each column's spread
        return (a + rng.normal(0.0, 0.02, a.shape) * sd).astype(np.float32)

    schema = DataSchema(kind="tabular", n_features=sensors.N_FEATURES, task="classification",
                        categorical=sensors.CATEGORICAL)
    det = fit_reference(_reference(np.concatenate([jitter(base) for _ in range(COPIES)]), schema, rng), seed=12)
    assert det.metadata()["reference_distinct"] == DISTINCT

    def fresh(n: int = 200) -> np.ndarray:
        return jitter(sensors.generate(n, rng=rng)[0])

    assert _flag_rate(det, [fresh() for _ in range(WINDOWS)]) <= 2 * FPR
    # the workflow's recalibration, and a weaker one (half its gain and offset), in every window
    for strength in (1.0, 0.5):
        assert _flag_rate(det, [sensors.recalibrate(fresh(), strength) for _ in range(5)]) == 1.0, strength
