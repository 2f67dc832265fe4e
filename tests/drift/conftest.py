"""Drift fixtures: the digits splits and one small detector fitted once per session (a few seconds)."""

from __future__ import annotations

import numpy as np
import pytest
from scanflow.examples.digits.data import Splits, load_splits

from scanflow.drift import AutoencoderDriftDetector


@pytest.fixture(scope="session")
def splits() -> Splits:
    return load_splits(seed=0)


@pytest.fixture(scope="session")
def detector(splits: Splits) -> AutoencoderDriftDetector:
    """Fitted on the train split, calibrated on the calibration split, default 30 epochs (~1-2 s)."""
    return AutoencoderDriftDetector(seed=0, num_threads=1).fit(splits.x_train, splits.x_calibration)


@pytest.fixture(scope="session")
def clean_pool(splits: Splits) -> np.ndarray:
    """Rows never seen in fit or calibration: clean windows are drawn from here."""
    return np.concatenate([splits.x_test, splits.x_feedback])
