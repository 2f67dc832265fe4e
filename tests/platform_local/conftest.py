"""Local-platform fixtures: a digits MLP registered in the shared MLflow server (two versions), and a
LocalPlatform that is always closed (every process it started is stopped) in `finally`."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

MODEL_NAME = "platform-local-digits"
HERE = Path(__file__).parent


def _train_and_register(seed: int, epochs: int) -> str:
    """Tiny torch MLP on sklearn digits, logged in pickle format (DESIGN.md §8) and registered."""
    import mlflow
    import mlflow.pytorch
    import numpy as np
    import torch
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    for _ in range(epochs):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xt), yt).backward()
        opt.step()
    mlflow.set_experiment("platform-local-tests")
    with mlflow.start_run():
        info = mlflow.pytorch.log_model(
            model, name="model", serialization_format="pickle", input_example=x[:2],
            registered_model_name=MODEL_NAME,
        )
    return str(info.registered_model_version)


@pytest.fixture(scope="session")
def models(mlflow_server: str) -> dict[str, str]:
    """{"v1": models:/NAME/a, "v2": models:/NAME/b}: two versions to tell primary from backup.

    The second version reuses the first one's artifacts (one training, one upload: cheaper); the
    version number, which replicas return with every prediction, is what tells them apart.
    """
    import mlflow
    from mlflow.tracking import MlflowClient

    v1 = _train_and_register(0, 20)
    first = MlflowClient(mlflow_server).get_model_version(MODEL_NAME, v1)
    v2 = mlflow.register_model(first.source, MODEL_NAME).version
    return {"v1": f"models:/{MODEL_NAME}/{v1}", "v2": f"models:/{MODEL_NAME}/{v2}"}


@pytest.fixture
def platform(mlflow_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    from scanflow.platform.local import LocalPlatform

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    p = LocalPlatform(tmp_path / "home", tracking_uri=mlflow_server, token="test-token-123")
    try:
        yield p
    finally:
        p.close()
