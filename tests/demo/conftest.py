"""Fixtures of the demo's tests: the venv's `scanflow` entry point."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def scanflow_exe() -> Path:
    exe = Path(sys.executable).with_name("scanflow")
    if not exe.exists():
        pytest.skip("the scanflow entry point is not installed in this environment")
    return exe
