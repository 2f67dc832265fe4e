"""Shared fixtures. Each area keeps its own fixtures in tests/<area>/conftest.py."""

from __future__ import annotations

import socket

import pytest


def free_port() -> int:
    """A TCP port free on loopback right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def port() -> int:
    return free_port()


# --- tracking (knowledge base): one real MLflow server for the whole session ------------------


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """URL of a real `mlflow server` on loopback (SQLite + proxied artifacts), shared by all tests.

    Sets MLFLOW_TRACKING_URI for the session (restored afterwards) so MLflow clients in this process and
    in child processes find it. Tests isolate themselves by unique experiment / model names.
    """
    import os

    import mlflow as mlflow_tracking

    from scanflow.tracking.server import MlflowServer

    home = tmp_path_factory.mktemp("mlflow")
    previous = os.environ.get("MLFLOW_TRACKING_URI")
    with MlflowServer(home, startup_timeout_s=180) as server:  # 2 shared cores can be very busy
        mlflow_tracking.set_tracking_uri(server.url)  # also sets MLFLOW_TRACKING_URI for children
        try:
            yield server.url
        finally:
            mlflow_tracking.set_tracking_uri(previous)  # type: ignore[arg-type]  # None unsets
            if previous is None:
                os.environ.pop("MLFLOW_TRACKING_URI", None)
            else:
                os.environ["MLFLOW_TRACKING_URI"] = previous
