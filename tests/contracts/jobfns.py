"""Job functions for the job-runner contract tests (imported by the runner in a child process)."""

from __future__ import annotations


def add(a: int, b: int, api_token: str = "") -> dict[str, int]:
    return {"sum": a + b}


def read(points_path: str) -> dict[str, str]:
    """Reads the file its param names (a plan's data file, on another machine's filesystem)."""
    with open(points_path) as f:
        return {"text": f.read(), "path": points_path}
