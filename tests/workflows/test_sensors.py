"""The sensors workflow: generated readings, the recalibration drift, the declaration, the training job."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
from scanflow.examples.sensors import data
from scanflow.examples.sensors.workflow import YAML_PATH, workflow

from scanflow.spec import Workflow

REPO = Path(__file__).parents[2]


def test_generate_is_seeded_and_has_the_documented_shape() -> None:
    x, y = data.generate(500, rng=3)
    x2, y2 = data.generate(500, rng=3)
    x3, _ = data.generate(500, rng=4)
    assert x.shape == (500, data.N_FEATURES) and x.dtype == np.float32 and y.dtype == np.int64
    assert np.array_equal(x, x2) and np.array_equal(y, y2) and not np.array_equal(x, x3)
    assert set(np.unique(x[:, 0])) == {0.0, 1.0, 2.0, 3.0}  # machine type codes
    assert set(np.unique(y)) == set(range(data.N_CLASSES))
    assert np.isfinite(x).all()


def test_faults_move_the_sensors_they_name() -> None:
    x, y = data.generate(20_000, rng=0)
    col = data.FEATURE_NAMES.index
    normal = x[y == 0]
    assert x[y == 1][:, col("vibration_mm_s")].mean() > normal[:, col("vibration_mm_s")].mean() + 0.8
    assert x[y == 2][:, col("temperature_c")].mean() > normal[:, col("temperature_c")].mean() + 6
    assert x[y == 3][:, col("pressure_bar")].mean() < normal[:, col("pressure_bar")].mean() - 1


def test_splits_are_disjoint_in_order_and_sized() -> None:
    s = data.load_splits(0)
    assert s.sizes() == data.SPLIT_SIZES
    x, _ = data.generate(sum(data.SPLIT_SIZES.values()), rng=0)
    assert np.array_equal(np.concatenate([s.x_train, s.x_holdout, s.x_traffic, s.x_test]), x)


def test_recalibrate_moves_exactly_the_recalibrated_columns() -> None:
    x, _ = data.generate(200, rng=1)
    out = data.recalibrate(x)
    moved = sorted(data.RECALIBRATION)
    kept = [c for c in range(data.N_FEATURES) if c not in moved]
    assert np.array_equal(out[:, kept], x[:, kept]) and not np.shares_memory(out, x)
    for c, (gain, offset) in data.RECALIBRATION.items():
        np.testing.assert_allclose(out[:, c], gain * x[:, c] + offset, rtol=1e-5)
    np.testing.assert_array_equal(data.recalibrate(x, strength=0.0), x)
    with pytest.raises(ValueError, match="shape"):
        data.recalibrate(x[:, :5])
    with pytest.raises(ValueError, match="strength"):
        data.recalibrate(x, strength=-1)


def test_training_rows_weights_extras_and_adds_moment_matched_copies() -> None:
    from scanflow.examples.sensors.model import training_rows

    s = data.load_splits(0)
    x, y, w, n_syn = training_rows(s.x_train, s.y_train)
    assert n_syn == 0 and len(x) == len(s.x_train) and np.all(w == 1)
    xe, ye = data.recalibrate(s.x_traffic[:100]), s.y_traffic[:100]
    x, y, w, n_syn = training_rows(s.x_train, s.y_train, (xe, ye))
    n = len(s.x_train)
    assert n_syn == n and len(x) == 2 * n + 100 and len(y) == len(w) == len(x)
    assert np.all(w[n:n + 100] == pytest.approx(0.2 * n / 100)) and np.all(w[:n] == 1)
    copies = x[n + 100:]
    np.testing.assert_array_equal(copies[:, 0], s.x_train[:, 0])  # machine type kept
    temp = data.FEATURE_NAMES.index("temperature_c")  # recalibrated column: copies look drifted
    assert abs(copies[:, temp].mean() - xe[:, temp].mean()) < 3.0
    assert abs(copies[:, temp].mean() - s.x_train[:, temp].mean()) > 40.0
    _, _, _, none_syn = training_rows(s.x_train, s.y_train, (xe, ye), adapt="none")
    assert none_syn == 0
    with pytest.raises(ValueError, match="adapt"):
        training_rows(s.x_train, s.y_train, (xe, ye), adapt="coral")


def test_traffic_pools_and_unseen_test() -> None:
    from scanflow.examples.sensors.s1 import traffic_pools, unseen_test

    pools = traffic_pools()
    (xc, yc), (xd, yd) = pools["clean"], pools["drifted"]
    assert len(xc) == len(xd) == 1000 and len(yc) == len(yd) == 1000
    s = data.load_splits(0)
    np.testing.assert_array_equal(xd, data.recalibrate(s.x_traffic[1000:]))  # other readings, recalibrated
    clean, drifted, y = unseen_test()
    np.testing.assert_array_equal(clean, s.x_test)
    np.testing.assert_array_equal(drifted, data.recalibrate(s.x_test))
    assert len(y) == len(clean)


def test_the_drift_costs_the_first_model_accuracy_on_unseen_readings() -> None:
    from scanflow.examples.sensors.model import accuracy, build_model, fit
    from scanflow.examples.sensors.s1 import unseen_test

    s = data.load_splits(0)
    model = fit(build_model(max_iter=40), s.x_train, s.y_train)
    clean, drifted, y = unseen_test(s)
    acc_clean, acc_drifted = accuracy(model, clean, y), accuracy(model, drifted, y)
    assert acc_clean > 0.85 and acc_drifted < acc_clean - 0.10


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"x": np.zeros((3, 10), np.float32)}, "needs arrays 'x' and 'y'"),
        ({"x": np.zeros((3, 9), np.float32), "y": np.zeros(3, np.int64)}, r"shape \(n, 10\)"),
        ({"x": np.zeros((3, 10), np.float32), "y": np.array([0, 1, 7])}, "labels 0..3"),
        ({"x": np.full((3, 10), 0.5, np.float32), "y": np.zeros(3, np.int64)}, "machine_type"),
        ({"x": np.full((1, 10), np.nan, np.float32), "y": np.zeros(1, np.int64)}, "NaN"),
    ],
)
def test_bad_points_files_get_a_clear_error(tmp_path: Path, arrays: dict[str, np.ndarray], message: str) -> None:
    from scanflow.examples.sensors.points import load_labelled

    path = tmp_path / "points.npz"
    np.savez(path, **arrays)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        load_labelled(path)


@pytest.mark.parametrize(("kw", "message"), [({"adapt": "coral"}, "adapt"), ({"max_iter": 0}, "max_iter"),
                                             ({"extra_points_path": "/nonexistent.npz"}, "does not exist")])
def test_train_refuses_bad_parameters_before_touching_mlflow(kw: dict[str, object], message: str) -> None:
    from scanflow.examples.sensors.train import train

    with pytest.raises(ValueError, match=message):
        train(tracking_uri="http://127.0.0.1:9", **kw)  # type: ignore[arg-type]  # nothing listens there


def test_yaml_is_the_exact_round_trip_of_the_python_declaration() -> None:
    assert Workflow.from_yaml(YAML_PATH.read_text()) == workflow
    assert YAML_PATH.read_text() == workflow.to_yaml()  # regenerate: python -m scanflow.examples.sensors.workflow
    svc = workflow.service("sensors")
    assert svc.model_uri == "models:/sensors@champion" and svc.backup == "sensors-backup"
    assert {a.role for a in workflow.agents} == {"tracker", "checker", "planner", "executor"}
    executor = next(a for a in workflow.agents if a.role == "executor")
    assert executor.settings["duplicate_tolerance"] == 0.0


def test_scanflow_validate_accepts_the_workflow_file() -> None:
    done = subprocess.run([sys.executable, "-m", "scanflow.cli", "validate", "workflows/sensors/workflow.py"],
                          cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.integration
def test_train_registers_a_served_model_with_its_reference_then_a_challenger(
    mlflow_server: str, tmp_path: Path
) -> None:
    from mlflow import MlflowClient
    from mlflow.models import get_model_info
    from scanflow.examples.sensors.s1 import traffic_pools
    from scanflow.examples.sensors.train import train

    from scanflow.serving.model import load_model
    from scanflow.tracking.reference import load_reference
    from scanflow.tracking.registry import get_alias_version

    name = f"sensors-{uuid.uuid4().hex[:8]}"
    first = train(model_name=name, tracking_uri=mlflow_server, max_iter=30)
    assert first["version"] == "1" and first["accuracy_clean"] > 0.8
    assert first["accuracy_drifted"] < first["accuracy_clean"] - 0.10
    # the champion alias moved onto the challenger: the challenger alias is cleared (the history stays in tags)
    assert get_alias_version(name, "champion") == "1" and get_alias_version(name, "challenger") is None
    info = get_model_info(f"models:/{name}/1")
    assert info.signature is not None and info.flavors.keys() >= {"sklearn", "python_function"}

    ref = load_reference(first["run_id"])
    assert ref.schema.kind == "tabular" and ref.schema.task == "classification"
    assert ref.schema.n_features == 10 and ref.schema.categorical == (0,)
    assert ref.schema.feature_names == data.FEATURE_NAMES
    assert ref.x.shape == (3000, 10) and ref.x_holdout.shape == (1000, 10) and ref.y_holdout.shape == (1000,)

    loaded = load_model(f"models:/{name}/1")
    assert loaded.n_features == 10
    s = data.load_splits(0)
    classes, _ = loaded.predict(s.x_test[:32])
    assert len(classes) == 32 and set(classes) <= set(range(data.N_CLASSES))

    x_d, y_d = traffic_pools(s)["drifted"]
    points, holdout = tmp_path / "critical.npz", tmp_path / "holdout.npz"
    np.savez(points, x=x_d[:150], y=y_d[:150])
    np.savez(holdout, x=x_d[500:600], y=y_d[500:600])
    second = train(model_name=name, tracking_uri=mlflow_server, max_iter=30, extra_points_path=str(points),
                   validation_points_path=str(holdout))
    assert second["version"] == "2" and second["n_extra"] == 150
    assert get_alias_version(name, "challenger") == "2" and get_alias_version(name, "champion") == "1"
    assert second["accuracy_drifted"] > first["accuracy_drifted"] + 0.3
    run = MlflowClient().get_run(second["run_id"])
    assert run.data.params["n_synthetic"] == "3000" and run.data.params["n_validation_drifted"] == "100"
    assert run.data.metrics["accuracy_validation_drifted"] == pytest.approx(second["accuracy_validation_drifted"])
    assert load_reference(second["run_id"]).x.shape == (3150, 10)  # clean training rows + the extra points
