"""Listening ports are picked outside the OS's ephemeral range (scanflow.platform.processes.free_port)."""

from __future__ import annotations

import socket

import pytest

from scanflow.platform import processes as procs


@pytest.mark.parametrize(("ephemeral", "expected"), [
    ((32768, 60999), (10000, 32768)),  # Linux's default: below it
    ((1024, 60000), (60001, 65536)),  # no room below: above it
    ((1024, 65000), (0, 0)),  # no room at all: the OS picks
])
def test_listen_port_range_avoids_the_ephemeral_range(ephemeral: tuple[int, int], expected: tuple[int, int]) -> None:
    assert procs.listen_port_range(ephemeral) == expected


def test_free_port_is_bindable_and_outside_the_ephemeral_range() -> None:
    low, high = procs._ephemeral_range()
    ports = {procs.free_port() for _ in range(20)}
    assert len(ports) > 1  # picked at random, not one fixed port
    for port in ports:
        assert not low <= port <= high
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))  # free right after the pick


def test_free_port_skips_a_taken_port(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each candidate is tried with a real bind: a listener's port is never handed out."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        monkeypatch.setattr(procs, "listen_port_range", lambda _e: (taken, taken + 1))  # only the taken one
        port = procs.free_port()
        assert port != taken  # fell back to the OS's pick after the tries
