"""Local-platform fixtures: the session's shared digits MLP (two versions, tests/conftest.py), and a
LocalPlatform that is always closed (every process it started is stopped) in `finally`."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.fixture(scope="session")
def models(digits_mlp: dict[str, str]) -> dict[str, str]:
    """{"v1": models:/NAME/1, "v2": models:/NAME/2}: the session's shared digits MLP (tests/conftest.py);
    replicas return the version with every prediction, which tells primary from backup."""
    return digits_mlp


@pytest.fixture
def platform(mlflow_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    from scanflow.platform.local import LocalPlatform

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    p = LocalPlatform(tmp_path / "home", tracking_uri=mlflow_server, token="test-token-123")
    try:
        yield p
    finally:
        p.close()
