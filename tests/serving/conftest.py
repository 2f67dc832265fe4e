"""Serving fixtures: a digits MLP registered in a real MLflow server (two versions), and launchers for
real replica / gateway OS processes on loopback (always stopped in `finally`)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from serving_helpers import Proc, free_port

MODEL_NAME = "serving-digits"


def train_and_register(name: str, seed: int, epochs: int) -> str:
    """Tiny torch MLP on sklearn digits (X/16 float32), logged (pickle format) and registered."""
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
    mlflow.set_experiment("serving-tests")
    with mlflow.start_run():
        info = mlflow.pytorch.log_model(
            model, name="model", serialization_format="pickle", input_example=x[:2],
            registered_model_name=name, pip_requirements=["torch==2.13.0"],  # skips a slow inference
        )
    return str(info.registered_model_version)


@pytest.fixture(scope="session")
def digits_models(mlflow_server: str) -> dict[str, str]:
    """Two registered versions of MODEL_NAME: {"v1": "models:/.../1", "v2": "models:/.../2"}."""
    v1 = train_and_register(MODEL_NAME, seed=0, epochs=30)
    v2 = train_and_register(MODEL_NAME, seed=1, epochs=5)
    return {"v1": f"models:/{MODEL_NAME}/{v1}", "v2": f"models:/{MODEL_NAME}/{v2}", "tracking": mlflow_server}


Launcher = Callable[..., Proc]


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Launcher]:
    """launch("replica"|"gateway", *args) -> Proc on a free port; every process is stopped afterwards."""
    procs: list[Proc] = []

    def _launch(
        kind: str, *args: str, wait: bool = True, env: dict[str, str] | None = None, port: int | None = None
    ) -> Proc:
        port = port or free_port()
        log = tmp_path / f"{kind}-{port}.log"
        cmd = [sys.executable, "-m", f"scanflow.serving.{kind}", "--port", str(port), *args]
        full_env = {**os.environ, **(env or {})}
        with open(log, "wb") as fh:
            popen = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=full_env)
        proc = Proc(popen, f"http://127.0.0.1:{port}", log)
        procs.append(proc)
        if wait:
            proc.wait_ready("/ready" if kind == "replica" else "/health")
        return proc

    try:
        yield _launch
    finally:
        for p in procs:
            p.stop()


@pytest.fixture(scope="session")
def digits_rows() -> list[list[float]]:
    from sklearn.datasets import load_digits

    return (load_digits().data[:40] / 16.0).tolist()
