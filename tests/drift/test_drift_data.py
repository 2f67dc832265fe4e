"""workflows/digits/data.py: splits are disjoint and stratified; corruptions are deterministic and bounded."""

from __future__ import annotations

import numpy as np
import pytest
from scanflow.examples.digits.data import KINDS, SEVERITIES, Splits, corrupt, load_splits


def test_splits_are_disjoint_scaled_and_cover_digits(splits: Splits) -> None:
    sizes = splits.sizes()
    assert sum(sizes.values()) == 1797
    assert min(sizes.values()) > 200
    parts = [splits.x_train, splits.x_calibration, splits.x_test, splits.x_feedback]
    for x in parts:
        assert x.dtype == np.float32 and x.shape[1] == 64
        assert x.min() >= 0.0 and x.max() <= 1.0
    rows = {r.tobytes() for x in parts for r in x}
    assert len(rows) > 1700  # a few digits are exact duplicates in the data set itself
    for y in (splits.y_train, splits.y_calibration, splits.y_test, splits.y_feedback):
        assert set(np.unique(y)) == set(range(10))


def test_load_splits_is_deterministic_per_seed() -> None:
    a, b, c = load_splits(3), load_splits(3), load_splits(4)
    assert np.array_equal(a.x_train, b.x_train) and np.array_equal(a.y_feedback, b.y_feedback)
    assert not np.array_equal(a.x_train, c.x_train)


@pytest.mark.parametrize("kind", KINDS)
def test_corrupt_keeps_shape_dtype_range_and_grows_with_severity(splits: Splits, kind: str) -> None:
    x = splits.x_test[:200]
    changes = []
    for sev in SEVERITIES:
        out = corrupt(x, kind, sev, np.random.default_rng(7))  # type: ignore[arg-type]
        again = corrupt(x, kind, sev, 7)  # type: ignore[arg-type]
        assert out.shape == x.shape and out.dtype == np.float32
        assert out.min() >= 0.0 and out.max() <= 1.0
        assert np.array_equal(out, again)
        changes.append(float(np.abs(out - x).mean()))
    assert 0.0 < changes[0] < changes[1] < changes[2]


def test_corrupt_refuses_bad_input(splits: Splits) -> None:
    x = splits.x_test[:5]
    with pytest.raises(ValueError, match="unknown corruption kind"):
        corrupt(x, "blur", 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="severity"):
        corrupt(x, "noise", 4)
    with pytest.raises(ValueError, match=r"shape \(n, 64\)"):
        corrupt(x.reshape(5, 8, 8), "noise", 1)
