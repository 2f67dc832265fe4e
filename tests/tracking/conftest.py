"""Fixtures of the tracking area: unique names, an untrained digits MLP, a prediction-log process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from scanflow.platform.processes import free_port

# `digits` (the data) and `make_mlp` (the model factory) are the session's shared ones in tests/conftest.py.


@pytest.fixture
def mlp(make_mlp):  # type: ignore[no-untyped-def]
    return make_mlp()


@pytest.fixture
def unique_name() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


# --- the process holding a prediction log, as a real OS process --------------------------------

APP = Path(__file__).with_name("predictions_app.py")
TOKEN = "test-token-not-a-secret"


class PredictionsApp:
    """Start / SIGKILL / restart `predictions_app.py`; the DB file (the log) survives restarts."""

    def __init__(self, db_url: str, experiment: str, workdir: Path, **opts: object) -> None:
        self.db_url = db_url
        self.experiment = experiment
        self.workdir = workdir
        self.opts = opts
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, deadline_s: float = 120.0) -> None:
        args = [sys.executable, str(APP), "--db", self.db_url, "--port", str(self.port), "--token", TOKEN]
        if self.experiment:
            args += ["--experiment", self.experiment]
        for k, v in self.opts.items():
            args += [f"--{k.replace('_', '-')}", str(v)]
        logf = open(self.workdir / f"app-{self.starts}.log", "wb")  # noqa: SIM115 - closed with the proc
        self.starts += 1
        self.proc = subprocess.Popen(args, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        logf.close()
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"predictions app exited: {self.proc.returncode}")
            try:
                if httpx.get(f"{self.url}/predictions/stats", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError("predictions app did not start")

    def stats(self) -> dict:  # type: ignore[type-arg]
        return httpx.get(f"{self.url}/predictions/stats", timeout=5).json()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=10)
        self.proc = None


@pytest.fixture
def predictions_app(mlflow_server: str, tmp_path: Path, unique_name: str):  # type: ignore[no-untyped-def]
    """A factory for PredictionsApp bound to a fresh DB and experiment; kills what it started."""
    started: list[PredictionsApp] = []

    def make(**opts: object) -> PredictionsApp:
        app = PredictionsApp(f"sqlite:///{tmp_path / 'log.db'}", f"wf-{unique_name}", tmp_path, **opts)
        started.append(app)
        return app

    try:
        yield make
    finally:
        for app in started:
            app.kill()


@pytest.fixture
def feedback_app(tmp_path: Path):  # type: ignore[no-untyped-def]
    """`predictions_app.py` with the feedback log mounted on its database, no MLflow: a real process
    to SIGKILL between feedback appends. Killed after the test."""
    app = PredictionsApp(f"sqlite:///{tmp_path / 'log.db'}", "", tmp_path, feedback=1)
    try:
        yield app
    finally:
        app.kill()


@pytest.fixture(name="record")
def record_fixture():  # type: ignore[no-untyped-def]
    return record


def record(i: int, *, width: int = 64, labels: bool = False) -> dict:  # type: ignore[type-arg]
    """A valid prediction record as JSON-ready dict, deterministic in `i`."""
    return {
        "request_id": f"req-{i:06d}",
        "service": "digits",
        "inputs": [[(i % 17) / 16.0] * width],
        "outputs": [i % 10],
        "model_version": "1",
        "latency_ms": 1.5,
        "ts": 1_700_000_000.0 + i,
        "labels": [i % 10] if labels else None,
    }
