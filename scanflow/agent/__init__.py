"""The agent runtime: declare an agent with decorators, serve it as a REST app with a durable loop.

    from scanflow.agent import Agent, Action, create_app, serve

Public API: Agent, Context, Event, Action, Outcome, TemporaryError, PermanentError, create_app,
get_context, AgentClient, AgentHTTPError, run_sync, serve, Store. See docs/architecture.md.
"""

from scanflow.agent.agent import Agent, AgentDefinitionError
from scanflow.agent.app import create_app, get_context
from scanflow.agent.client import AgentClient, AgentHTTPError, run_sync
from scanflow.agent.context import Context
from scanflow.agent.serve import serve
from scanflow.agent.store import Store
from scanflow.agent.types import Action, Event, Outcome, PermanentError, TemporaryError

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
