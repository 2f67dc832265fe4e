"""The digits workflow declaration and its YAML twin; the model trains fast and well."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scanflow.examples.digits.workflow import YAML_PATH, workflow

from scanflow.spec import Workflow, load_workflow


def test_yaml_is_the_exact_round_trip_of_the_python_declaration() -> None:
    assert Workflow.from_yaml(YAML_PATH.read_text()) == workflow
    assert YAML_PATH.read_text() == workflow.to_yaml()  # regenerate: python -m scanflow.examples.digits.workflow


def test_declaration_wires_service_backup_job_and_four_agents() -> None:
    svc = workflow.service("digits")
    assert svc.model_uri == "models:/digits@champion" and svc.backup == "digits-backup"
    assert svc.slo.latency_ms == 50.0
    assert workflow.job("train").entrypoint == "scanflow.examples.digits.train:train"
    assert {a.role for a in workflow.agents} == {"tracker", "checker", "planner", "executor"}
    assert load_workflow(Path(__file__).parents[2] / "workflows/digits/workflow.py") == workflow


def test_model_is_deterministic_and_learns_digits_quickly() -> None:
    from scanflow.examples.digits.data import load_splits
    from scanflow.examples.digits.model import accuracy, build_model, fit

    s = load_splits(0)
    a, b = build_model(seed=3), build_model(seed=3)
    assert all(np.array_equal(p.detach().numpy(), q.detach().numpy()) for p, q in zip(a.parameters(), b.parameters()))
    losses = fit(a, s.x_train, s.y_train, epochs=10)
    assert losses[-1] < losses[0] / 3
    assert accuracy(a, s.x_test, s.y_test) > 0.9


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"x": np.zeros((3, 64), np.float32)}, "needs arrays 'x' and 'y'"),
        ({"x": np.zeros((3, 10), np.float32), "y": np.zeros(3, np.int64)}, r"shape \(n, 64\)"),
        ({"x": np.zeros((3, 64), np.float32), "y": np.array([0, 1, 12])}, "labels 0..9"),
        ({"x": np.zeros((3, 64), np.float32), "y": np.zeros(2, np.int64)}, "y must have shape"),
        ({"x": np.full((1, 64), np.nan, np.float32), "y": np.zeros(1, np.int64)}, "NaN"),
    ],
)
def test_bad_extra_points_get_a_clear_error(tmp_path: Path, arrays: dict[str, np.ndarray], message: str) -> None:
    from scanflow.examples.digits.train import load_extra_points

    path = tmp_path / "points.npz"
    np.savez(path, **arrays)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        load_extra_points(path)


def test_missing_or_garbage_extra_points_file(tmp_path: Path) -> None:
    from scanflow.examples.digits.train import load_extra_points

    with pytest.raises(ValueError, match="does not exist"):
        load_extra_points(tmp_path / "nope.npz")
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="not a readable"):
        load_extra_points(bad)


@pytest.mark.parametrize(("kw", "message"), [({"drift_kind": "blur"}, "drift_kind"), ({"epochs": 0}, "epochs"),
                                             ({"drift_severity": 7}, "drift_severity"),
                                             ({"adapt": "coral"}, "adapt")])
def test_train_refuses_bad_parameters_before_touching_mlflow(kw: dict[str, object], message: str) -> None:
    from scanflow.examples.digits.train import train

    with pytest.raises(ValueError, match=message):
        train(tracking_uri="http://127.0.0.1:9", **kw)  # type: ignore[arg-type]  # nothing listens there
