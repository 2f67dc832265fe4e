"""Fixtures of the agent area: a file-backed store and agent processes (helpers: agent_support)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from agent_support import HERE, TOKEN, AgentProcess

from scanflow.agent import Store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(f"sqlite:///{tmp_path / 'agent.db'}")
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., AgentProcess]]:
    """Factory of agent processes; every one started is stopped at the end, whatever happens."""
    started: list[AgentProcess] = []

    def factory(
        name: str,
        port: int,
        *,
        args: list[str] | None = None,
        env: dict[str, str] | None = None,
        file: Path = HERE / "sample_agents.py",
    ) -> AgentProcess:
        p = AgentProcess(file, name, port, tmp_path, {"SCANFLOW_TOKEN": TOKEN, **(env or {})}, args or [])
        started.append(p)
        return p

    try:
        yield factory
    finally:
        for p in started:
            p.stop()
