"""Planted defects for the progressive-delivery checks: a registered version that passes for the champion
on paper but serves worse.

- `register_transposed`: reads its inputs wrongly, as a preprocessing mismatch at serving time would.
  tests/e2e/test_delivery_rollback.py and benchmarks/canary.py (an operator delivers it with the Executor's
  `start_delivery`; the agents must roll it back).
- `Slowed`: as accurate as the model it wraps, and slow on every call, which no offline accuracy gate sees.
  The digits training job makes one when given `serving_delay_ms` (tests/e2e/test_delivery_rollback.py:
  S1's own retrain passes the gate, and the agents must roll it back on its live p99).
"""

from __future__ import annotations

import time
from typing import Any

import torch


class Slowed(torch.nn.Module):
    """`inner`, waiting `delay_s` on each forward call (a model that is right, and late)."""

    def __init__(self, inner: torch.nn.Module, delay_s: float) -> None:
        super().__init__()
        self.inner, self.delay_s = inner, float(delay_s)

    def forward(self, x: Any) -> Any:
        time.sleep(self.delay_s)
        return self.inner(x)


def register_transposed(source_version: str, model_name: str = "digits", experiment: str = "digits-operator") -> str:
    """A copy of `source_version` whose first layer reads each 8x8 image transposed, registered as a new
    version of `model_name` in MLflow's configured tracking server; returns the version."""
    import mlflow

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
