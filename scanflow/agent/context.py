"""`Context`: the one typed object every sensor, actuator, hook and callable constraint receives.

It gives a handler what it may touch and nothing hidden: its agent's `name` and `settings`, the
clock (`now()`, injectable for tests), the persisted JSON `state`, the `store`, a logger, the
`peers`, and the ways to act: `emit` (local event into the durable inbox), `call` (another agent's
actuator over REST, with an idempotency key), `send_event` (another agent's inbox), `since(action)`.

The runtime owns one base context; for each action it hands out a shallow copy carrying that
action's idempotency key (`ctx.key`), which peers' calls and emitted events derive their keys from,
so a retry after a crash repeats the same keys and is deduplicated downstream.
Who calls: scanflow.agent.runtime builds it; user handlers use it.
"""

from __future__ import annotations

import copy
import logging
import math
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from scanflow.agent.client import AgentClient, AgentHTTPError
from scanflow.agent.types import Event, PermanentError, TemporaryError
from scanflow.settings import Settings

if TYPE_CHECKING:
    from scanflow.agent.runtime import Runtime
    from scanflow.agent.store import Store
    from scanflow.spec import AgentSpec, Workflow



@contextmanager
def peer_errors(agent: str) -> Iterator[None]:
    """A failure to reach peer `agent` as the runtime's errors: TemporaryError (peer down, 5xx, 429,
    timeouts: retried) or PermanentError (4xx, or the peer's actuator failed permanently)."""
    try:
        yield
    except AgentHTTPError as exc:
        if exc.retryable:
            raise TemporaryError(f"peer {agent!r}: {exc}", delay_s=1.0) from None
        raise PermanentError(f"peer {agent!r}: {exc}") from None
    except (TemporaryError, PermanentError):
        raise
    except Exception as exc:  # noqa: BLE001 - any other failure to reach the peer is temporary
        raise TemporaryError(f"peer {agent!r} unreachable: {type(exc).__name__}: {exc}") from None

def _unbound(agent: str) -> str:
    return (f"agent {agent!r} was started without a workflow (Agent.bound; scanflow agent run binds the "
            "workflow file SCANFLOW_WORKFLOW names)")


class Context:
    """Handed to handlers. Prefer `await ctx.emit(...)`; sync handlers (run in threads) use `emit_sync`."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        settings: Settings,
        peers: Mapping[str, str],
        clock: Callable[[], float],
        log: logging.Logger,
    ) -> None:
        self._runtime = runtime
        self.name: str = runtime.agent.name
        self.role: str = runtime.agent.role
        self.settings = settings
        self.peers: dict[str, str] = dict(peers)
        self._clock = clock
        self.log = log
        self.key: str | None = None  # the idempotency key of the action being run, if any
        self.event: Event | None = None  # the event whose strategy started this action, if any
        self._emitted = 0

    @property
    def store(self) -> Store:
        return self._runtime.store

    @property
    def workflow(self) -> Workflow:
        """The workflow this agent was bound to at start (Agent.bound); LookupError when it was not."""
        wf = self._runtime.agent.workflow
        if wf is None:
            raise LookupError(_unbound(self.name))
        return wf

    @property
    def spec(self) -> AgentSpec:
        """This agent's declaration in its workflow (its settings and strategies); LookupError unbound."""
        spec = self._runtime.agent.spec
        if spec is None:
            raise LookupError(_unbound(self.name))
        return spec

    @property
    def resources(self) -> dict[str, Any]:
        """Objects this agent's process opened (logs, clients, caches): shared by its handlers and
        routes (Agent.routes), never persisted; one dict per running agent, not per module."""
        return self._runtime.resources

    @property
    def state(self) -> dict[str, Any]:
        """The agent's JSON state; saved to the store after each handler that changed it."""
        return self._runtime.state

    def now(self) -> float:
        return self._clock()

    def since(self, action: str) -> float:
        """Seconds since `action` (an actuator name, or 'agent.actuator') last succeeded; inf if never."""
        at = self._runtime.last_success.get(action)
        return math.inf if at is None else max(0.0, self.now() - at)

    def for_action(self, key: str | None, event: Event | None = None) -> Context:
        """A copy carrying `key` and the triggering `event` (cheap; state, store, clients are shared)."""
        c = copy.copy(self)
        c.key = key
        c.event = event
        c._emitted = 0
        return c

    def _derive_key(self, kind: str, given: str | None) -> str | None:
        if given is not None:
            return given
        if self.key is None:
            return None
        self._emitted += 1
        return f"{self.key}:{kind}:{self._emitted}"

    # -- local inbox ---------------------------------------------------------------------------------
    async def emit(self, name: str, payload: Mapping[str, Any] | None = None, key: str | None = None) -> int:
        """Put an event into this agent's durable inbox; returns its id (the first id for a known key)."""
        event_id, _dup = await self._runtime.submit_event(
            name, dict(payload or {}), self._derive_key("emit", key), source=self.name
        )
        return event_id

    def emit_sync(self, name: str, payload: Mapping[str, Any] | None = None, key: str | None = None) -> int:
        """`emit` for sync handlers running in a worker thread (never call it on the event loop)."""
        event_id, _dup = self._runtime.submit_event_blocking(
            name, dict(payload or {}), self._derive_key("emit", key), source=self.name
        )
        return event_id

    # -- peers -----------------------------------------------------------------------------------------
    def client(self, agent: str) -> AgentClient:
        if agent not in self.peers:
            raise PermanentError(f"unknown peer agent {agent!r}; known peers: {sorted(self.peers)}")
        return self._runtime.peer_client(agent)

    async def call(
        self, agent: str, actuator: str, args: Mapping[str, Any] | None = None, key: str | None = None
    ) -> dict[str, Any]:
        """Run `actuator` on peer `agent` over REST; returns its result. The peer's handler sees
        this action's triggering event as its `ctx.event`.

        Raises TemporaryError (peer down, 5xx, 429, timeouts: retried by the runtime) or
        PermanentError (4xx, or the peer's actuator failed permanently).
        """
        k = self._derive_key("call", key) or f"{self.name}:call:{uuid.uuid4().hex}"
        event = self.event.to_ref() if self.event is not None else None
        with peer_errors(agent):
            body = await self.client(agent).call_actuator(actuator, dict(args or {}), key=k, event=event)
        return dict(body.get("result") or {})

    async def send_event(
        self, agent: str, name: str, payload: Mapping[str, Any] | None = None, key: str | None = None
    ) -> dict[str, Any]:
        """Post an event into peer `agent`'s inbox -> {"id", "duplicate"}; errors as in `call`."""
        k = self._derive_key("send", key)
        with peer_errors(agent):
            return await self.client(agent).post_event(name, dict(payload or {}), key=k, source=self.name)
