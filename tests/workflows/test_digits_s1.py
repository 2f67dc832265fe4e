"""workflows/digits/s1.py and the scanner corruptions: the gate's digits never reach the traffic, the
slices are stratified and deterministic, and the scanner drifts are bounded, deterministic and systematic."""

from __future__ import annotations

import numpy as np
import pytest
from scanflow.examples.digits.data import KINDS, SENSOR_KINDS, SEVERITIES, corrupt, load_splits
from scanflow.examples.digits.s1 import (
    DRIFT_KIND,
    GATE_COPIES,
    TRAFFIC_COPIES,
    calibration_traffic,
    feedback_slices,
    gate_data,
    traffic_pools,
    unseen_test,
)


def _rows(x: np.ndarray) -> set[bytes]:
    return {r.tobytes() for r in x}


def test_feedback_slices_are_disjoint_complete_and_stratified() -> None:
    y = load_splits(0).y_feedback
    traffic, gate = feedback_slices(y)
    assert set(traffic).isdisjoint(gate) and len(traffic) + len(gate) == len(y)
    for label in range(10):
        n_gate, n_all = int((y[gate] == label).sum()), int((y == label).sum())
        assert n_gate == int(np.ceil(n_all / 3))
    again = feedback_slices(y)
    assert np.array_equal(again[0], traffic) and np.array_equal(again[1], gate)
    with pytest.raises(ValueError, match="gate_fraction"):
        feedback_slices(y, 1.0)


def test_gate_digits_never_travel_in_the_traffic() -> None:
    s = load_splits(0)
    pools = traffic_pools(splits=s)
    gate = gate_data(splits=s)
    x_clean = pools["clean"][0]
    assert len(pools["drifted"][0]) == TRAFFIC_COPIES * len(x_clean)
    # the gate's clean rows: its own feedback digits (none in the traffic) plus the clean test split
    n_gate = len(gate.x_drifted) // GATE_COPIES
    assert _rows(gate.x_clean[:n_gate]).isdisjoint(_rows(x_clean))
    assert _rows(gate.x_clean[n_gate:]) == _rows(s.x_test)
    # the corrupted gate rows are corruptions of the gate digits, not of traffic digits
    assert np.array_equal(gate.y_drifted, np.concatenate([gate.y_clean[:n_gate]] * GATE_COPIES))
    assert _rows(gate.x_drifted).isdisjoint(_rows(pools["drifted"][0]))
    # unseen test digits are in neither
    _, x_unseen, _ = unseen_test(splits=s)
    assert _rows(x_unseen).isdisjoint(_rows(gate.x_drifted) | _rows(pools["drifted"][0]))


def test_calibration_traffic_is_stratified_and_adds_distinct_digits_outside_train_test_and_gate() -> None:
    s = load_splits(0)
    picked = calibration_traffic(s.y_calibration, 0.4)
    assert len(set(picked.tolist())) == len(picked)
    for label in range(10):
        assert int((s.y_calibration[picked] == label).sum()) == int(np.ceil(0.4 * (s.y_calibration == label).sum()))
    assert len(calibration_traffic(s.y_calibration, 0.0)) == 0
    with pytest.raises(ValueError, match="fraction"):
        calibration_traffic(s.y_calibration, 1.5)
    only_feedback = traffic_pools(splits=s)["clean"][0]  # the default (measured: more digits did not help)
    assert _rows(only_feedback) == _rows(s.x_feedback[feedback_slices(s.y_feedback)[0]])
    clean = traffic_pools(splits=s, calibration_fraction=0.4)["clean"][0]
    # with 0.4 the traffic holds the feedback traffic digits and about twice as many distinct digits
    assert _rows(only_feedback) <= _rows(clean) and len(_rows(clean)) > 1.9 * len(_rows(only_feedback))
    assert _rows(clean).isdisjoint(_rows(s.x_train) | _rows(s.x_test) | _rows(gate_data(splits=s).x_clean))


@pytest.mark.parametrize("kind", SENSOR_KINDS)
def test_scanner_corruptions_are_bounded_deterministic_and_grow(kind: str) -> None:
    x = load_splits(0).x_test[:200]
    changes = []
    for sev in SEVERITIES:
        out = corrupt(x, kind, sev, np.random.default_rng(3))  # type: ignore[arg-type]
        assert out.shape == x.shape and out.dtype == np.float32
        assert out.min() >= 0.0 and out.max() <= 1.0
        assert np.array_equal(out, corrupt(x, kind, sev, 3))  # type: ignore[arg-type]
        changes.append(float(np.abs(out - x).mean()))
    assert 0.0 < changes[0] < changes[1] < changes[2]


def test_scanner_drift_is_systematic_and_the_old_kinds_are_unchanged() -> None:
    """Two read-outs differ only by the read noise: the transform is the same for every image (what
    makes it learnable), unlike the per-image rotations of the old kinds, which stay as they were."""
    x = load_splits(0).x_test[:200]
    a, b = corrupt(x, DRIFT_KIND, 2, 1), corrupt(x, DRIFT_KIND, 2, 2)
    assert float(np.abs(a - b).mean()) < 0.06 < float(np.abs(a - x).mean())
    assert KINDS == ("noise", "rotation", "shift")
    sigma = float((corrupt(x, "noise", 2, 5) - x)[(x > 0.3) & (x < 0.7)].std())
    assert 0.15 < sigma < 0.25  # noise severity 2 is still sigma 0.2
