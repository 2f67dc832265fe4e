"""The sensors drift scenario's data: the labelled traffic the load sends, and unseen rows to report on.

Who calls it: load generators and benchmarks driving the sensors workflow, and the tests;
`python -m scanflow.examples.sensors.s1` re-measures the figures below (offline, no stack; 2 min on 2 busy cores).

The drift is the sensor recalibration of scanflow.examples.sensors.data (`recalibrate`): thermocouples
swapped for units reporting degF, a re-mounted accelerometer (0.7x gain, +1.2 mm/s), an acoustic sensor
4 dB lower. The traffic split (2,000 readings) is cut in two, so the drifted readings are other
readings than the clean ones, as after a real maintenance visit: the first half is the clean pool, the
second half recalibrated is the drifted pool. The test split is never sent, trained on or used by the
promotion gate (which reads the reference holdout): `unseen_test` reports on it.

Measured (seed 0, `measure()`, unseen test split of 2,000 readings; retrains on n labelled rows drawn
from the drifted pool, 5 draws, mean [min]):
- first model: clean 0.898, recalibrated 0.275 (-62 points);
- retrain with  80 drifted rows: drifted 0.887 [0.874], clean 0.895 (without synthetic copies,
  adapt="none": drifted 0.851 [0.822]);
- retrain with 200 drifted rows: drifted 0.893 [0.884], clean 0.898 (adapt="none": 0.869 [0.865]).
"""

from __future__ import annotations

import numpy as np
from scanflow.examples.sensors.data import Array, Labels, Splits, load_splits, recalibrate

SPLIT_SEED = 0


def traffic_pools(splits: Splits | None = None) -> dict[str, tuple[Array, Labels]]:
    """The load's labelled rows: {"clean": first half of the traffic split, "drifted": the second half
    as the recalibrated sensors read it}. Labels are true machine states (the feedback set)."""
    s = splits or load_splits(SPLIT_SEED)
    half = len(s.x_traffic) // 2
    return {"clean": (s.x_traffic[:half], s.y_traffic[:half]),
            "drifted": (recalibrate(s.x_traffic[half:]), s.y_traffic[half:])}


def unseen_test(splits: Splits | None = None) -> tuple[Array, Array, Labels]:
    """(clean test rows, the same rows recalibrated, labels): readings nothing in the stack ever saw."""
    s = splits or load_splits(SPLIT_SEED)
    return s.x_test, recalibrate(s.x_test), s.y_test


POST_DRIFT_ROWS = 2000
POST_DRIFT_SEED = 20_261_127  # a generator seed no split, pool or benchmark uses


def post_drift_pool(n: int = POST_DRIFT_ROWS) -> tuple[Array, Labels]:
    """The world S1 leaves: freshly generated readings as the recalibrated sensors read them, rows no
    reference, retrain, calibration or pool ever held (what the scenarios send after the promotion)."""
    from scanflow.examples.sensors.data import generate

    x, y = generate(n, rng=POST_DRIFT_SEED)
    return recalibrate(x), y


def measure(sizes: tuple[int, ...] = (80, 200), draws: int = 5, seed: int = 0) -> dict[str, float]:
    """Offline figures of the docstring: the first model's clean and drifted accuracy, and per retrain
    size n (and adapt mode) the mean and min drifted accuracy and the mean clean accuracy over `draws`
    random draws of n labelled rows from the drifted pool. Fits what the training job fits."""
    from scanflow.examples.sensors.model import accuracy, build_model, fit, training_rows

    s = load_splits(seed)
    x_clean, x_drifted, y = unseen_test(s)
    first = fit(build_model(seed=seed), s.x_train, s.y_train)
    out = {"first_clean": accuracy(first, x_clean, y), "first_drifted": accuracy(first, x_drifted, y)}
    pool_x, pool_y = traffic_pools(s)["drifted"]
    for adapt in ("moments", "none"):
        for n in sizes:
            drifted, clean = [], []
            for draw in range(draws):
                pick = np.random.default_rng(draw).choice(len(pool_x), n, replace=False)
                rows = training_rows(s.x_train, s.y_train, (pool_x[pick], pool_y[pick]), adapt=adapt, seed=seed)
                model = fit(build_model(seed=seed), rows[0], rows[1], rows[2])
                drifted.append(accuracy(model, x_drifted, y))
                clean.append(accuracy(model, x_clean, y))
            out[f"{adapt}_{n}_drifted_mean"] = float(np.mean(drifted))
            out[f"{adapt}_{n}_drifted_min"] = float(np.min(drifted))
            out[f"{adapt}_{n}_clean_mean"] = float(np.mean(clean))
    return out


if __name__ == "__main__":
    for key, value in measure().items():
        print(f"{key:28s} {value:.3f}")
