"""log_to_mlflow / load_from_mlflow against a real MLflow tracking store (SQLite, local artifacts)."""

from __future__ import annotations

import numpy as np
import pytest

from scanflow.drift import AutoencoderDriftDetector


@pytest.mark.integration
def test_log_and_load_round_trip(
    detector: AutoencoderDriftDetector, clean_pool: np.ndarray, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    exp = mlflow.create_experiment("drift-test", artifact_location=(tmp_path / "artifacts").as_uri())
    try:
        with mlflow.start_run(experiment_id=exp) as run:
            art = detector.log_to_mlflow("drift_detector")
        assert art == f"runs:/{run.info.run_id}/drift_detector"
        logged = mlflow.get_run(run.info.run_id)
        assert logged.data.params["drift_detector.backend"] == "ae"
        assert "drift_detector.error_threshold" in logged.data.metrics
        again = AutoencoderDriftDetector.load_from_mlflow(art)
        x = clean_pool[:100]
        assert again.predict(x).p_value == pytest.approx(detector.predict(x).p_value, rel=1e-9)
    finally:
        mlflow.set_tracking_uri(None)  # type: ignore[arg-type]
