"""Fixtures of the digits workflow tests: a unique registered-model name per test."""

from __future__ import annotations

import uuid

import pytest


@pytest.fixture
def model_name() -> str:
    return f"digits-{uuid.uuid4().hex[:8]}"
