"""Planted defects for the progressive-delivery checks: a registered version that passes for the champion
on paper but serves worse, as a preprocessing mismatch at serving time would.

Who calls: tests/e2e/test_delivery_rollback.py and benchmarks/canary.py (an operator delivers it with the
Executor's `start_delivery`; the agents must roll it back).
"""

from __future__ import annotations


def register_transposed(source_version: str, model_name: str = "digits", experiment: str = "digits-operator") -> str:
    """A copy of `source_version` whose first layer reads each 8x8 image transposed, registered as a new
    version of `model_name` in MLflow's configured tracking server; returns the version."""
    import mlflow
    import torch

    model = mlflow.pytorch.load_model(f"models:/{model_name}/{source_version}")
    first = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    transposed = torch.arange(64).reshape(8, 8).T.reshape(-1)
    with torch.no_grad():
        first.weight.copy_(first.weight[:, transposed])
    mlflow.set_experiment(experiment)
    with mlflow.start_run():
        info = mlflow.pytorch.log_model(model, name=model_name, serialization_format="pickle",
                                        registered_model_name=model_name)
    return str(info.registered_model_version)
