"""Job functions the platform's run_job tests execute in a child process (imported by name)."""

from __future__ import annotations

import time


def train(epochs: int = 1, api_key: str = "") -> dict[str, float]:
    print(f"training for {epochs} epochs")
    return {"accuracy": 0.5 + 0.1 * epochs, "epochs": epochs}


def explode() -> None:
    print("about to fail")
    raise RuntimeError("boom: the job failed on purpose")


def slow(seconds: float = 60.0) -> None:
    print("sleeping", flush=True)
    time.sleep(seconds)
