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


def own_cmdline(api_key: str = "", **_: object) -> dict[str, str]:
    """What `ps` and /proc show for this job's process: the argv the platform started it with."""
    with open("/proc/self/cmdline", "rb") as f:
        return {"cmdline": f.read().replace(b"\0", b" ").decode(), "got_key": str(bool(api_key))}
