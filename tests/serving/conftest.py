"""Serving fixtures: the session's shared digits MLP (two versions, tests/conftest.py), and launchers for
real replica / gateway OS processes on loopback (always stopped in `finally`)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from serving_helpers import Proc, free_port


@pytest.fixture(scope="session")
def digits_models(digits_mlp: dict[str, str]) -> dict[str, str]:
    """Two registered versions of the session's shared digits MLP (tests/conftest.py `digits_mlp`):
    {"v1": "models:/serving-digits/1", "v2": "models:/serving-digits/2", "tracking": url}; they answer
    differently, so a hot swap shows in the outputs."""
    return digits_mlp


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
        # a replica with a Tracker URL keeps a record spool: one per process here, never the working
        # directory's default, so no run replays records a previous run left
        full_env = {**os.environ, "SCANFLOW_SPOOL_DIR": str(tmp_path / f"spool-{port}"), **(env or {})}
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
