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
