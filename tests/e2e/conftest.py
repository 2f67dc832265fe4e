"""Fixtures of the end-to-end scenarios: the labelled traffic pools (helpers are in e2e_support.py).

The stack itself is started inside each test (EmbeddedStack in tmp_path): a scenario is one whole
life of the system, from bootstrap to shutdown.
"""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="session")
def pools() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Traffic rows with TRUE labels: the feedback split clean, and the same images with noise (drift).

    The drifted pool repeats the feedback images 8 times with fresh noise each time, so retraining
    and evaluation see distinct rows. Neither pool overlaps the test split used for evaluation.
    """
    from workflows.digits.data import corrupt, load_splits

    s = load_splits(0)
    xs = np.concatenate([s.x_feedback] * 8)
    ys = np.concatenate([s.y_feedback] * 8)
    return {"clean": (s.x_feedback, s.y_feedback), "drifted": (corrupt(xs, "noise", 2, rng=7), ys)}
