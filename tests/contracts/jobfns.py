"""Job functions for the job-runner contract tests (imported by the runner in a child process)."""

from __future__ import annotations


def add(a: int, b: int, api_token: str = "") -> dict[str, int]:
    return {"sum": a + b}
