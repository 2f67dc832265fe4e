"""The reg5 fixture workflow: a regression model served as a pyfunc, under the same training contract."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.reg5 import data

REPO = Path(__file__).parents[2]


def test_generate_is_seeded_and_linear() -> None:
    x, y = data.generate(4000, rng=2)
    x2, y2 = data.generate(4000, rng=2)
    assert x.shape == (4000, 5) and x.dtype == np.float32 and y.shape == (4000,)
    assert np.array_equal(x, x2) and np.array_equal(y, y2)
    resid = y - (x.astype(np.float64) @ data.WEIGHTS + data.INTERCEPT)
    assert abs(resid.std() - data.NOISE_SD) < 0.05


def test_shift_moves_two_features_only() -> None:
    x, _ = data.generate(100, rng=0)
    out = data.shift(x)
    np.testing.assert_allclose(out[:, 1] - x[:, 1], 1.5, rtol=1e-5)
    np.testing.assert_allclose(out[:, 3] - x[:, 3], -2.0, rtol=1e-5)
    np.testing.assert_array_equal(out[:, [0, 2, 4]], x[:, [0, 2, 4]])
    with pytest.raises(ValueError, match="shape"):
        data.shift(x[:, :4])


def test_ridge_recovers_the_weights_and_the_shift_biases_it() -> None:
    from tests.fixtures.reg5.model import LinearPyfunc, fit_ridge, rmse

    s = data.load_splits(0)
    coef, intercept = fit_ridge(*s["train"])
    np.testing.assert_allclose(coef, data.WEIGHTS, atol=0.05)
    model = LinearPyfunc(coef, intercept)
    xt, yt = s["test"]
    assert rmse(model.predict(None, xt), yt) < 0.55
    assert rmse(model.predict(None, data.shift(xt)), yt) > 3.0  # bias -2*1.5 + 1*(-2) = -5


def test_train_refuses_a_bad_points_file_before_touching_mlflow(tmp_path: Path) -> None:
    from tests.fixtures.reg5.train import train

    bad = tmp_path / "p.npz"
    np.savez(bad, x=np.zeros((3, 4), np.float32), y=np.zeros(3))
    with pytest.raises(ValueError, match="shape"):
        train(tracking_uri="http://127.0.0.1:9", extra_points_path=str(bad))
    with pytest.raises(ValueError, match="does not exist"):
        train(tracking_uri="http://127.0.0.1:9", validation_points_path=str(tmp_path / "none.npz"))


def test_scanflow_validate_accepts_the_fixture_workflow() -> None:
    done = subprocess.run([sys.executable, "-m", "scanflow.cli", "validate", "tests/fixtures/reg5/workflow.py"],
                          cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    from tests.fixtures.reg5.workflow import workflow

    assert workflow.service("reg5").backup == "reg5-backup"
    assert {a.role for a in workflow.agents} == {"tracker", "checker", "planner", "executor"}


@pytest.mark.integration
def test_train_registers_a_served_pyfunc_with_its_reference_then_a_challenger(
    mlflow_server: str, tmp_path: Path
) -> None:
    from mlflow.models import get_model_info

    from scanflow.serving.model import load_model
    from scanflow.tracking.reference import load_reference
    from scanflow.tracking.registry import get_alias_version
    from tests.fixtures.reg5.train import train

    name = f"reg5-{uuid.uuid4().hex[:8]}"
    first = train(model_name=name, tracking_uri=mlflow_server)
    assert first["version"] == "1" and first["rmse_clean"] < 0.6 and first["rmse_drifted"] > 3.0
    assert get_alias_version(name, "champion") == "1"
    info = get_model_info(f"models:/{name}/1")
    assert info.signature is not None and "python_function" in info.flavors

    ref = load_reference(first["run_id"])
    assert ref.schema.task == "regression" and ref.schema.kind == "tabular" and ref.schema.n_features == 5
    assert ref.x.shape == (1500, 5) and ref.x_holdout.shape == (500, 5) and ref.y_holdout.dtype == np.float64

    loaded = load_model(f"models:/{name}/1")
    assert loaded.n_features == 5
    xt, yt = data.load_splits(0)["test"]
    values, probs = loaded.predict(xt[:16])
    assert probs is None and len(values) == 16
    assert np.sqrt(np.mean((np.asarray(values) - yt[:16]) ** 2)) < 1.0

    xd, yd = data.shift(data.load_splits(0)["traffic"][0]), data.load_splits(0)["traffic"][1]
    points = tmp_path / "critical.npz"
    np.savez(points, x=xd[:200], y=yd[:200])
    second = train(model_name=name, tracking_uri=mlflow_server, extra_points_path=str(points))
    assert second["version"] == "2" and second["n_extra"] == 200
    assert second["rmse_drifted"] < first["rmse_drifted"]
    assert get_alias_version(name, "challenger") == "2" and get_alias_version(name, "champion") == "1"
    assert load_reference(second["run_id"]).x.shape == (1700, 5)
