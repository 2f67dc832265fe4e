"""The Checker's accuracy estimate per drift check (scanflow/standard/checker.py `_performance`), model and Tracker stubbed."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

from scanflow.drift.performance import ConfidenceCalibration, PerformanceEstimator


class Ctx:
    def __init__(self) -> None:
        self.state: dict[str, Any] = {}
        self.peers = {"tracker": "http://tracker:8001"}
        self.log = logging.getLogger("test.checker")


def _estimator() -> PerformanceEstimator:
    rng = np.random.default_rng(0)
    conf = rng.uniform(0.5, 1.0, 500)
    cal = ConfidenceCalibration.fit(np.stack([conf, 1 - conf], 1), [0] * 500, list(np.where(rng.random(500) < conf, 0, 1)))

    def predict(x: np.ndarray) -> tuple[list[int], np.ndarray]:
        c = np.clip(x[:, 0], 0.5, 1.0)
        return [0] * len(x), np.stack([c, 1 - c], 1)

    return PerformanceEstimator(predict, cal)


def test_estimate_now_and_measured_accuracy_once_labels_arrive(monkeypatch: pytest.MonkeyPatch) -> None:
    from scanflow.standard import checker
    from scanflow.tracking import feedback_client

    monkeypatch.setattr(checker, "_current_estimator", lambda ctx, version: _estimator())
    labels: dict[str, list[Any]] = {}
    monkeypatch.setattr(feedback_client, "lookup_labels", lambda ctx, ids: {i: labels[i] for i in ids if i in labels})
    ctx: Any = Ctx()
    x = np.full((30, 3), 0.9, np.float32)
    owners = [f"r{i}" for i in range(30)]
    first = checker._performance(ctx, "1", x, owners, 30)
    assert first is not None and abs(first["estimated_accuracy"] - 0.9) < 0.1 and first["feedback"] == []
    assert len(ctx.state["performance_pending"]) == 1
    labels.update({f"r{i}": [0 if i < 24 else 1] for i in range(30)})  # the first window's labels arrive
    second = checker._performance(ctx, "1", x, [f"s{i}" for i in range(30)], 60)
    assert second is not None and second["feedback"][0]["to_seq"] == 30
    assert second["feedback"][0]["measured_accuracy"] == pytest.approx(0.8)
    assert [w["to_seq"] for w in ctx.state["performance_pending"]] == [60]  # the labelled window is done
    metrics = checker._performance_metrics(second)
    assert metrics["performance/measured_accuracy"] == pytest.approx(0.8) and "performance/estimate_error" in metrics
    assert checker._performance_metrics(None) == {}


def test_no_estimate_for_models_without_one(monkeypatch: pytest.MonkeyPatch) -> None:
    from scanflow.standard import checker

    monkeypatch.setattr(checker, "_current_estimator", lambda ctx, version: None)
    assert checker._performance(Ctx(), "1", np.zeros((5, 3), np.float32), ["a"] * 5, 5) is None
