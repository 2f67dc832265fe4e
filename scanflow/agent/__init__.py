"""The agent runtime: declare an agent with decorators, serve it as a REST app with a durable loop.

    from scanflow.agent import Agent, Action, create_app, serve

Public API: Agent, Context, Event, Action, Outcome, TemporaryError, PermanentError, create_app,
get_context, AgentClient, AgentHTTPError, run_sync, serve, Store. See docs/architecture.md.

Names are imported lazily (PEP 562) so that `scanflow --help`, which imports the `agent` CLI
sub-app from this package, does not pay for FastAPI, SQLAlchemy and httpx.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scanflow.agent.agent import Agent, AgentDefinitionError
    from scanflow.agent.app import create_app, get_context
    from scanflow.agent.client import AgentClient, AgentHTTPError, run_sync
    from scanflow.agent.context import Context
    from scanflow.agent.serve import serve
    from scanflow.agent.store import Store
    from scanflow.agent.types import Action, Event, Outcome, PermanentError, TemporaryError

_WHERE = {
    "Agent": "agent",
    "AgentDefinitionError": "agent",
    "create_app": "app",
    "get_context": "app",
    "AgentClient": "client",
    "AgentHTTPError": "client",
    "run_sync": "client",
    "Context": "context",
    "serve": "serve",
    "Store": "store",
    "Action": "types",
    "Event": "types",
    "Outcome": "types",
    "PermanentError": "types",
    "TemporaryError": "types",
}

__all__ = [
    "Action",
    "Agent",
    "AgentClient",
    "AgentDefinitionError",
    "AgentHTTPError",
    "Context",
    "Event",
    "Outcome",
    "PermanentError",
    "Store",
    "TemporaryError",
    "create_app",
    "get_context",
    "run_sync",
    "serve",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'scanflow.agent' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"scanflow.agent.{module}"), name)
    globals()[name] = value
    return value
