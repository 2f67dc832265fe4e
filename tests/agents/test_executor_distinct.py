"""The retrain counts each input once: near-identical critical points (replayed traffic) collapse to one."""

from __future__ import annotations

import numpy as np

from scanflow.standard.retraining import distinct_rows

DIGITS_TOLERANCE = 0.04  # the digits workflow's `duplicate_tolerance` (workflows/digits/workflow.py)


def test_copies_within_read_noise_collapse_and_distinct_digits_stay() -> None:
    from scanflow.examples.digits.s1 import traffic_pools
    from scanflow.examples.digits.workflow import executor

    assert executor.settings["duplicate_tolerance"] == DIGITS_TOLERANCE
    pools = traffic_pools()
    n = len(pools["clean"][0])
    x, y = pools["drifted"]  # 8 scanned copies of each traffic digit, fresh read noise per copy
    keep = distinct_rows(x[: 3 * n], DIGITS_TOLERANCE)  # every digit three times
    assert keep.tolist() == list(range(n))  # the first copy of each digit, in order, and no digit lost
    assert (y[keep] == pools["clean"][1]).all()


def test_tolerance_is_the_rms_difference() -> None:
    base = np.zeros((1, 64), np.float32)
    near = base + DIGITS_TOLERANCE * 0.9  # RMS difference 0.9 x tolerance
    far = base + DIGITS_TOLERANCE * 1.1
    assert distinct_rows(np.concatenate([base, near, far, base]), DIGITS_TOLERANCE).tolist() == [0, 2]
    assert distinct_rows(np.zeros((0, 64), np.float32)).tolist() == []


def test_default_removes_exact_duplicates_only() -> None:
    rows = np.array([[1.0, 2.0], [1.0, 2.0001], [3.0, 4.0], [1.0, 2.0]], np.float32)
    assert distinct_rows(rows).tolist() == [0, 1, 2]
