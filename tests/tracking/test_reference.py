"""The reference-data contract: schema checks, file round trip, and logging/reading through a real MLflow."""

from __future__ import annotations

import numpy as np
import pytest

from scanflow.tracking.reference import (
    REFERENCE_DIR,
    SERVING_REFERENCE_DIR,
    DataSchema,
    ReferenceError,
    ReferenceMissingError,
    load_reference,
    log_reference,
    make_reference,
    read_reference,
    save_reference,
)


def _data(n: int = 60, f: int = 5, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, f)), rng.normal(size=(30, f)), rng.integers(0, 3, 30)


def test_schema_checks_name_the_part() -> None:
    with pytest.raises(ReferenceError, match="image_shape"):
        DataSchema(kind="image", n_features=64, task="classification", image_shape=(8, 7))
    with pytest.raises(ReferenceError, match="categorical"):
        DataSchema(kind="tabular", n_features=3, task="regression", categorical=(3,))
    with pytest.raises(ReferenceError, match="task"):
        DataSchema(kind="tabular", n_features=3, task="ranking")  # type: ignore[arg-type]
    with pytest.raises(ReferenceError, match="feature_names"):
        DataSchema(kind="tabular", n_features=3, task="regression", feature_names=("a",))
    s = DataSchema(kind="image", n_features=64, task="classification", image_shape=(1, 8, 8))
    assert DataSchema.from_dict(s.to_dict()) == s


def test_make_reference_refuses_bad_arrays() -> None:
    x, xh, yh = _data()
    with pytest.raises(ReferenceError, match="x_holdout: rows have 4 features, expected 5"):
        make_reference(x, xh[:, :4], yh, task="classification")
    with pytest.raises(ReferenceError, match="at least 20"):
        make_reference(x[:5], xh, yh, task="classification")
    with pytest.raises(ReferenceError, match="one target per holdout row"):
        make_reference(x, xh, yh[:-1], task="classification")
    bad = x.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ReferenceError, match="NaN"):
        make_reference(bad, xh, yh, task="classification")
    with pytest.raises(ReferenceError, match="integers or strings"):
        make_reference(x, xh, yh + 0.5, task="classification")
    ref = make_reference(x, xh, yh.astype(float), task="classification", max_rows=40)
    assert ref.x.shape == (40, 5) and ref.y_holdout.dtype.kind == "i"


def test_images_are_flattened_and_round_trip(tmp_path) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(1)
    x, xh = rng.random((50, 8, 8)), rng.random((25, 8, 8))
    ref = make_reference(x, xh, rng.integers(0, 10, 25), task="classification", kind="image", image_shape=(8, 8))
    assert ref.schema.n_features == 64
    back = read_reference(save_reference(ref, tmp_path / "r"))
    assert back.schema == ref.schema
    np.testing.assert_array_equal(back.x, ref.x)
    np.testing.assert_array_equal(back.y_holdout, ref.y_holdout)
    with pytest.raises(ReferenceMissingError):
        read_reference(tmp_path / "nothing")


def test_log_and_load_through_mlflow(mlflow_server: str, unique_name: str) -> None:
    import mlflow

    x, xh, yh = _data(f=7)
    exp = mlflow.set_experiment(unique_name)
    with mlflow.start_run(experiment_id=exp.experiment_id) as run:
        uri = log_reference(x, xh, yh, task="regression", feature_names=tuple("abcdefg"))
    assert uri == f"runs:/{run.info.run_id}/{REFERENCE_DIR}"
    ref = load_reference(run.info.run_id)
    assert ref.schema.task == "regression" and ref.schema.feature_names == tuple("abcdefg")
    np.testing.assert_allclose(ref.x, x.astype(np.float32))
    # a serving reference logged later (by the Executor, after a promotion) is preferred
    log_reference(x + 5, xh + 5, yh, task="regression", run_id=run.info.run_id, artifact_path=SERVING_REFERENCE_DIR)
    assert load_reference(run.info.run_id).x.mean() > 4
    assert load_reference(run.info.run_id, REFERENCE_DIR).x.mean() < 1
    with mlflow.start_run(experiment_id=exp.experiment_id) as bare:
        pass
    with pytest.raises(ReferenceMissingError, match="log_reference"):
        load_reference(bare.info.run_id)
    with pytest.raises(ReferenceError, match="active MLflow run"):
        log_reference(x, xh, yh, task="regression")
