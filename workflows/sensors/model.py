"""The sensors model and the rows it is fitted on: a histogram gradient-boosted tree classifier.

Who calls it: scanflow.examples.sensors.train (the job), scanflow.examples.sensors.s1's offline measurement and the
tests. Pure functions plus `fit`, no MLflow: offline experiments measure exactly what the job trains.

Why this model: gradient-boosted trees are the usual choice for tabular readings, and scikit-learn's
`HistGradientBoostingClassifier` handles the machine-type code natively (`categorical_features`), so
the served artefact is one estimator the mlflow.sklearn flavor loads without custom code.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scanflow.examples.sensors.data import CATEGORICAL, NUMERIC, Array, Labels

ADAPT_CHOICES = ("moments", "none")
# What the skops file of a fitted model may hold besides plain sklearn/numpy types. Why: mlflow.sklearn
# saves in skops format, which refuses to load types not named here; these are the ones the boosted
# trees reference, reviewed: the model is written by our own training job.
SKOPS_TRUSTED_TYPES: tuple[str, ...] = ("functools.partial", "sklearn.utils.validation.check_array",
                                        "sklearn.ensemble._hist_gradient_boosting.predictor.TreePredictor")
# The labelled drifted rows together weigh at least this share of the clean training rows (each row
# weighs max(1, EXTRA_SHARE * n_clean / n_extra)): 80 rows against 3,000 clean ones weigh 7.5 each.
EXTRA_SHARE = 0.2


def build_model(*, max_iter: int = 100, learning_rate: float = 0.1, seed: int = 0) -> Any:
    """An unfitted classifier; column 0 (machine type) is categorical. Deterministic given `seed`."""
    from sklearn.ensemble import HistGradientBoostingClassifier

    return HistGradientBoostingClassifier(categorical_features=list(CATEGORICAL), max_iter=max_iter,
                                          learning_rate=learning_rate, early_stopping=False, random_state=seed)


def training_rows(x: Array, y: Labels, extra: tuple[Array, Labels] | None = None, *, adapt: str = "moments",
                  extra_share: float = EXTRA_SHARE, seed: int = 0) -> tuple[Array, Labels, np.ndarray, int]:
    """Pure: (x, y, sample weights, number of synthetic rows) a model is fitted on.

    No extra rows: the clean rows, weight 1. With `extra` (labelled drifted rows from feedback): the
    clean rows, the extra rows weighted max(1, extra_share * n_clean / n_extra) so that ~100-300 of them
    move a model fitted on thousands, and with adapt="moments" one synthetic drifted copy of every clean
    row (weight 1): its numeric columns moved by the per-column gain and offset that carry the clean
    rows' mean and spread onto the extra rows' (class-balanced,
    `scanflow.drift.adapt.moment_matched_copies`), its machine type and label kept. Why: a sensor
    recalibration IS a per-column gain and offset, so the copies carry it to all clean rows; measured
    offline (workflows/sensors/s1.py), 80 labelled rows without copies reached 0.851 drifted
    accuracy on unseen readings, with copies 0.887 (clean 0.898)."""
    from scanflow.drift.adapt import MIN_TARGET_ROWS, moment_matched_copies

    if adapt not in ADAPT_CHOICES:
        raise ValueError(f"adapt must be one of {list(ADAPT_CHOICES)}, got {adapt!r}")
    if extra_share < 0:
        raise ValueError(f"extra_share must be >= 0, got {extra_share}")
    if extra is None or len(extra[0]) == 0:
        return x, y, np.ones(len(x)), 0
    xe, ye = extra
    weight = max(1.0, extra_share * len(x) / len(xe))
    parts_x, parts_y = [x, xe], [y, ye]
    parts_w = [np.ones(len(x)), np.full(len(xe), weight)]
    n_synthetic = 0
    if adapt == "moments" and len(xe) >= MIN_TARGET_ROWS:
        num = list(NUMERIC)
        copies = x.copy()
        copies[:, num] = moment_matched_copies(x[:, num], xe[:, num], rng=seed, source_labels=y, target_labels=ye)
        parts_x.append(copies)
        parts_y.append(y)
        parts_w.append(np.ones(len(x)))
        n_synthetic = len(x)
    return (np.concatenate(parts_x).astype(np.float32, copy=False), np.concatenate(parts_y),
            np.concatenate(parts_w), n_synthetic)


def fit(model: Any, x: Array, y: Labels, weights: np.ndarray | None = None) -> Any:
    """Fit in one thread. Why: on 2 shared, busy cores OpenMP's spinning threads made one fit take
    15.7 s instead of 0.6 s (measured here); a training job must not fight the serving replicas."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        model.fit(x, y, sample_weight=weights)
    return model


def accuracy(model: Any, x: Array, y: Labels) -> float:
    """Share of rows whose predicted state is the true one (0.0 for no rows)."""
    return float(np.mean(model.predict(x) == y)) if len(y) else 0.0
