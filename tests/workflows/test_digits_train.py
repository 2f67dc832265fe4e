"""The training job against a real MLflow server: register, alias, metrics; runnable as a module."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).parents[2]


def test_first_model_becomes_champion_and_retrain_on_critical_points_becomes_challenger(
    mlflow_server: str, model_name: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from mlflow import MlflowClient
    from scanflow.examples.digits.data import corrupt, load_splits
    from scanflow.examples.digits.train import train

    from scanflow.tracking.registry import get_alias_version

    with caplog.at_level(logging.INFO, logger="scanflow.examples.digits.train"):
        first = train(tracking_uri=mlflow_server, model_name=model_name, epochs=20)
    # its stages, in order, as they start: a job's log and notebook 01's progress lines
    stages = [r.getMessage() for r in caplog.records if r.name == "scanflow.examples.digits.train"]
    assert [m.split(" ")[0] for m in stages] == ["fitting", "fitted", "logging", "trained"], stages
    assert stages[0].startswith("fitting 5 MLPs x 20 epochs on ")
    assert set(first) >= {"version", "run_id", "accuracy_clean", "accuracy_drifted"}
    assert first["version"] == "1" and first["accuracy_clean"] > 0.9
    assert get_alias_version(model_name, "champion") == "1"
    # the champion alias moved onto the challenger: the challenger alias is cleared (the history stays in tags)
    assert get_alias_version(model_name, "challenger") is None
    run = MlflowClient().get_run(first["run_id"])
    assert run.data.metrics["accuracy_clean"] == pytest.approx(first["accuracy_clean"])
    assert run.data.params["n_extra"] == "0"

    # critical points: corrupted feedback images with their TRUE labels
    s = load_splits(0)
    points = tmp_path / "critical.npz"
    np.savez(points, x=corrupt(s.x_feedback, "noise", 2, rng=1), y=s.y_feedback)
    holdout = tmp_path / "holdout.npz"  # drifted rows held out of training: reported, not trained on
    np.savez(holdout, x=corrupt(s.x_test[:50], "noise", 2, rng=2), y=s.y_test[:50])
    second = train(tracking_uri=mlflow_server, model_name=model_name, extra_points_path=str(points), epochs=20,
                   validation_points_path=str(holdout))
    assert second["version"] == "2" and second["n_extra"] == len(s.x_feedback)
    second_run = MlflowClient().get_run(second["run_id"])
    assert second_run.data.metrics["accuracy_validation_drifted"] == pytest.approx(second["accuracy_validation_drifted"])
    assert second_run.data.params["n_validation_drifted"] == "50" and "accuracy_validation_drifted" not in first
    # the retrain also fits one synthetic drifted copy of each clean training row (scanflow.examples.digits.train)
    assert second_run.data.params["adapt"] == "moments"
    assert second_run.data.params["n_synthetic"] == str(len(s.x_train)) and run.data.params["n_synthetic"] == "0"
    assert get_alias_version(model_name, "challenger") == "2"
    assert get_alias_version(model_name, "champion") == "1"  # promotion is the Planner's decision
    assert second["accuracy_drifted"] > first["accuracy_drifted"]


@pytest.mark.slow
def test_module_entrypoint_trains_and_refuses_bad_input(mlflow_server: str, model_name: str) -> None:
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_server}
    cmd = [sys.executable, "-m", "scanflow.examples.digits.train", "--model-name", model_name]
    ok = subprocess.run(cmd + ["--epochs", "5"], check=False, cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr[-2000:]
    result = json.loads(ok.stdout.strip().splitlines()[-1])
    assert result["version"] == "1" and "champion" in result["aliases"]
    bad = subprocess.run(cmd + ["--extra-points", "/nonexistent.npz"], check=False, cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "does not exist" in bad.stderr
