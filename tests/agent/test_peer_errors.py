"""How a failed call to a peer agent reaches the runtime (`ctx.call`, `ctx.send_event`): what may pass is
retried (TemporaryError), what will not pass stops the action (PermanentError)."""

from __future__ import annotations

import httpx
import pytest

from scanflow.agent.client import AgentHTTPError
from scanflow.agent.context import peer_errors
from scanflow.agent.types import PermanentError, TemporaryError


@pytest.mark.parametrize(("exc", "expected", "words"), [
    (AgentHTTPError(503, "busy", "http://p/x"), TemporaryError, "peer 'executor': http://p/x: HTTP 503"),
    (AgentHTTPError(429, "slow down", "http://p/x"), TemporaryError, "HTTP 429"),
    (AgentHTTPError(0, "connection refused", "http://p/x"), TemporaryError, "connection refused"),
    (AgentHTTPError(422, "bad plan", "http://p/x"), PermanentError, "HTTP 422: bad plan"),
    (httpx.ConnectError("refused"), TemporaryError, "unreachable: ConnectError: refused"),
    (PermanentError("the peer's actuator failed"), PermanentError, "the peer's actuator failed"),
])
def test_a_peer_failure_becomes_a_temporary_or_permanent_error(exc: Exception, expected: type, words: str) -> None:
    with pytest.raises(expected, match=words.replace("(", r"\(")), peer_errors("executor"):
        raise exc


def test_a_cancelled_call_is_not_turned_into_an_error() -> None:
    import asyncio

    with pytest.raises(asyncio.CancelledError), peer_errors("executor"):
        raise asyncio.CancelledError
