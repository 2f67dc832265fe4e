"""Label-free accuracy estimate for classifiers: confidence-based performance estimation (as NannyML's CBPE).

Who calls it: the Checker agent (scanflow/standard/checker.py `check_drift`) reports an estimate with every drift
check, and compares it with the accuracy measured from feedback labels once they arrive; tests and
benchmarks. Pure numpy at estimate time; scikit-learn's isotonic regression at fit time.

How. On the reference's holdout (clean labelled rows the model never trained on,
scanflow/tracking/reference.py) the model's top-class probability is calibrated against whether the
prediction was right: an isotonic (monotone) map confidence -> P(correct). A window's estimated accuracy
is the mean calibrated confidence of its rows; its standard deviation, sqrt(sum p (1 - p)) / n, is how
far the realised accuracy of n rows may sit from the estimate by chance alone. Why calibrate: raw softmax
confidences of small neural nets are over-confident (a digits MLP's mean top probability is several points
above its accuracy), and the estimate would be off by as much on clean data.

What it cannot do: it assumes P(correct | confidence) stays what the holdout showed (covariate shift).
Under drift that confuses the model confidently (a changed meaning of inputs, concept drift) it
over-estimates; the feedback comparison is there to show when that happens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from scanflow.labels import same_label

MIN_HOLDOUT = 20  # fewer labelled holdout rows cannot calibrate confidences


@dataclass(frozen=True)
class PerformanceEstimate:
    """A window's estimated accuracy, the sd of the realised accuracy around it, and its rows."""

    accuracy: float
    sd: float
    n: int

    def to_dict(self) -> dict[str, float | int]:
        return {"estimated_accuracy": self.accuracy, "estimated_accuracy_sd": self.sd, "n": self.n}


def confidences(probabilities: ArrayLike) -> NDArray[np.float64]:
    """Top-class probability per row of an (n, classes) array; ValueError on another shape or non-finite rows."""
    p = np.asarray(probabilities, dtype=np.float64)
    if p.ndim != 2 or p.shape[1] < 2 or len(p) < 1:
        raise ValueError(f"probabilities: expected (n >= 1, classes >= 2), got shape {p.shape}")
    if not np.isfinite(p).all():
        raise ValueError("probabilities: contain NaN or infinite values")
    return p.max(axis=1)


@dataclass(frozen=True)
class ConfidenceCalibration:
    """The isotonic map confidence -> P(correct) learnt on the holdout, as interpolation knots."""

    knots_x: NDArray[np.float64]
    knots_y: NDArray[np.float64]
    n: int
    holdout_accuracy: float

    @classmethod
    def fit(cls, probabilities: ArrayLike, predicted: Sequence[Any], y_true: Sequence[Any]) -> ConfidenceCalibration:
        """From the model's probabilities and predicted labels on the holdout, and the holdout's true labels."""
        from sklearn.isotonic import IsotonicRegression

        conf = confidences(probabilities)
        if not len(conf) == len(predicted) == len(y_true):
            raise ValueError(f"{len(conf)} probability rows, {len(predicted)} predictions, {len(y_true)} labels")
        if len(conf) < MIN_HOLDOUT:
            raise ValueError(f"{len(conf)} holdout rows: need at least {MIN_HOLDOUT} to calibrate confidences")
        correct = np.array([same_label(p, y) for p, y in zip(predicted, y_true, strict=True)], dtype=np.float64)
        iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(conf, correct)
        return cls(np.asarray(iso.X_thresholds_, dtype=np.float64), np.asarray(iso.y_thresholds_, dtype=np.float64),
                   len(conf), float(correct.mean()))

    def p_correct(self, probabilities: ArrayLike) -> NDArray[np.float64]:
        """Calibrated probability that each row's prediction is right."""
        return np.interp(confidences(probabilities), self.knots_x, self.knots_y)

    def estimate(self, probabilities: ArrayLike) -> PerformanceEstimate:
        p = self.p_correct(probabilities)
        return PerformanceEstimate(float(p.mean()), float(math.sqrt(float((p * (1 - p)).sum())) / len(p)), len(p))

    def to_dict(self) -> dict[str, Any]:
        return {"knots_x": self.knots_x.tolist(), "knots_y": self.knots_y.tolist(), "n": self.n,
                "holdout_accuracy": self.holdout_accuracy}


def measured_accuracy(predicted: Sequence[Any], labels: Sequence[Any | None]) -> tuple[float | None, int]:
    """(accuracy over the rows that have a label, how many have one); (None, 0) when none has."""
    pairs = [(p, y) for p, y in zip(predicted, labels, strict=True) if y is not None]
    if not pairs:
        return None, 0
    return float(np.mean([same_label(p, y) for p, y in pairs])), len(pairs)


@dataclass(frozen=True)
class PerformanceEstimator:
    """A classifier's predict function and its confidence calibration: estimates a window's accuracy."""

    predict: Any  # rows -> (predicted labels, scores (n, classes) | None), as scanflow.serving.model serves
    calibration: ConfidenceCalibration

    def window(self, x: ArrayLike) -> tuple[PerformanceEstimate, list[Any]]:
        """(the estimate, the predicted label of each row). Blocking (the model)."""
        from scanflow.serving.model import as_probabilities

        labels, scores = self.predict(np.asarray(x, dtype=np.float32))
        if scores is None:
            raise ValueError("the model gives no class scores for these rows")
        return self.calibration.estimate(as_probabilities(scores)), list(labels)


def estimator_for_version(model_name: str, version: str) -> PerformanceEstimator | None:
    """The estimator of a registered classifier version: the model loaded from the registry, calibrated on
    its reference holdout. None for regression models and models that give no class scores. Blocking."""
    from scanflow.serving.model import as_probabilities, load_model
    from scanflow.tracking.reference import reference_for_version

    ref = reference_for_version(model_name, version)
    if ref.schema.task != "classification" or len(ref.x_holdout) < MIN_HOLDOUT:
        return None
    model = load_model(f"models:/{model_name}/{version}")
    labels, scores = model.predict(np.asarray(ref.x_holdout, dtype=np.float32))
    if scores is None or np.asarray(scores).ndim != 2 or np.asarray(scores).shape[1] < 2:
        return None
    cal = ConfidenceCalibration.fit(as_probabilities(scores), list(labels), list(ref.y_holdout))
    return PerformanceEstimator(model.predict, cal)


# -- comparing estimates with feedback, as labels arrive (the Checker keeps `pending` in its state) -------
PENDING_WINDOWS = 5  # checked windows whose labels are still awaited, newest last
MIN_LABELLED = 20  # labelled rows before a window's measured accuracy is reported


def _plain(label: Any) -> Any:
    """A JSON-able label (numpy scalars to Python)."""
    return label.item() if isinstance(label, np.generic) else label


def pending_window(to_seq: int, estimate: PerformanceEstimate, request_ids: Sequence[str],
                   predicted: Sequence[Any]) -> dict[str, Any]:
    """What the Checker keeps of a checked window until its labels arrive: the estimate and, per request,
    the predicted label of each row (request ids repeat for requests of several rows, in row order)."""
    by_request: dict[str, list[Any]] = {}
    for rid, label in zip(request_ids, predicted, strict=True):
        by_request.setdefault(rid, []).append(_plain(label))
    return {"to_seq": int(to_seq), "estimated_accuracy": estimate.accuracy, "estimated_accuracy_sd": estimate.sd,
            "predicted": by_request}


def compare_with_feedback(pending: list[dict[str, Any]], labels: dict[str, list[Any]], *,
                          min_labelled: int = MIN_LABELLED,
                          keep: int = PENDING_WINDOWS) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Pure: (comparisons, windows still pending) given the feedback labels known now (request id -> labels).

    A window is compared once at least `min_labelled` of its rows have a label (a request's labels are
    matched to its rows in order; a request whose label count differs from its rows is left out): its
    estimate, the measured accuracy, the labelled rows and the error (estimate - measured). It stays
    pending while rows are unlabelled, so a later check compares it again on more labels; the `keep`
    newest windows are kept."""
    done: list[dict[str, Any]] = []
    still: list[dict[str, Any]] = []
    for w in pending:
        predicted, truth = [], []
        total = 0
        for rid, preds in w["predicted"].items():
            total += len(preds)
            got = labels.get(rid)
            if got is not None and len(got) == len(preds):
                predicted += preds
                truth += got
        acc, n = measured_accuracy(predicted, truth)
        if acc is not None and n >= min(min_labelled, total):
            done.append({"to_seq": w["to_seq"], "estimated_accuracy": w["estimated_accuracy"],
                         "measured_accuracy": acc, "labelled": n, "rows": total,
                         "error": w["estimated_accuracy"] - acc})
        if n < total:
            still.append(w)
    return done, still[-keep:]
