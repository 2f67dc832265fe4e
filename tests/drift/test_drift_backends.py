"""Optional alibi-detect backends (skipped when it is absent) and the error when it is missing."""

from __future__ import annotations

import numpy as np
import pytest
from scanflow.examples.digits.data import corrupt

import scanflow.drift.alibi_backend as alibi_module
from scanflow.drift import AutoencoderDriftDetector, alibi_available

needs_alibi = pytest.mark.skipif(not alibi_available(), reason="alibi-detect is not installed")


def test_missing_alibi_is_a_clear_error_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(alibi_module, "alibi_available", lambda: False)
    with pytest.raises(ImportError, match="alibi-detect"):
        AutoencoderDriftDetector(backend="mmd")
    AutoencoderDriftDetector(backend="ae")  # the core needs no alibi-detect


@needs_alibi
@pytest.mark.parametrize("backend", ["ks", "mmd"])
def test_alibi_backend_on_the_encoder(
    backend: str, detector: AutoencoderDriftDetector, clean_pool: np.ndarray
) -> None:
    det = AutoencoderDriftDetector(backend=backend, num_threads=1)  # type: ignore[arg-type]
    det.model, det.x_ref = detector.model, detector.x_ref  # reuse the fitted autoencoder
    det.infer_threshold(detector.x_cal)
    x = clean_pool[:200]
    clean = det.predict(x)
    drifted = det.predict(corrupt(x, "shift", 3, 1))
    assert drifted.is_drift and drifted.p_value < 0.01 and drifted.metadata["backend"] == backend
    assert not clean.is_drift
    assert drifted.drift_rate > clean.drift_rate
