"""A job function the Kubernetes run_job test runs through the real job runner (imported by name in a
child process, as the Job's container would)."""

from __future__ import annotations


def train(epochs: int = 1, lr: float = 0.1, api_token: str = "") -> dict[str, float]:
    print(f"training {epochs} epochs at lr {lr}")
    return {"accuracy": 0.5 + 0.1 * epochs, "epochs": epochs}
