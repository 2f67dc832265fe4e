"""Fixtures of the end-to-end scenarios: the labelled traffic pools (helpers are in e2e_support.py).

The stack itself is started inside each test (EmbeddedStack in tmp_path): a scenario is one whole
life of the system, from bootstrap to shutdown.
"""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="session")
def pools() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Traffic rows with TRUE labels: S1's traffic digits clean, and the same digits through S1's drift
    (the "new scanner" of scanflow.examples.digits.s1, 8 copies each with fresh read noise), so every S1 path
    (this fixture, tests/e2e/test_s1_drift.py, benchmarks/s1.py) meets the same drift. Neither pool
    holds the promotion gate's digits or the test split."""
    from scanflow.examples.digits.s1 import traffic_pools

    return traffic_pools()
