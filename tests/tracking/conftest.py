"""Fixtures of the tracking area: a small trained-enough torch model on digits and unique names."""

from __future__ import annotations

import uuid

import numpy as np
import pytest


@pytest.fixture(scope="session")
def digits() -> tuple[np.ndarray, np.ndarray]:
    """sklearn's bundled digits, float32 scaled to [0, 1]."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return (d.data / 16.0).astype(np.float32), d.target.astype(np.int64)


def make_mlp(seed: int = 0):  # type: ignore[no-untyped-def]
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


@pytest.fixture
def mlp():  # type: ignore[no-untyped-def]
    return make_mlp()


@pytest.fixture(name="make_mlp")
def make_mlp_fixture():  # type: ignore[no-untyped-def]
    """The factory itself, for tests that need several distinct models."""
    return make_mlp


@pytest.fixture
def unique_name() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"
