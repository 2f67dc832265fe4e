"""What one coalesced attempt at a replica gives each client request, and when that is the answer.

Its own module because both fronts of the gateway read it: the ASGI app (scanflow.serving.gateway)
and the fast front (scanflow.serving.fastfront), which the gateway's command line loads; kept in the
gateway, the two modules imported each other.
"""

from __future__ import annotations

from scanflow.serving.routing import Upstream

RETRY_STATUSES = frozenset({502, 503})  # the replica is draining / not ready: another one can answer

# (status, body, content-type, upstream), status NO_ANSWER when the upstream could not answer at all;
# None when it was never sent (forward it on its own).
Outcome = tuple[int, bytes, bytes, Upstream] | None
NO_ANSWER = 0


def final(outcome: Outcome) -> bool:
    """True when a coalesced call's outcome is the client's answer (no retry needed)."""
    return outcome is not None and outcome[0] != NO_ANSWER and outcome[0] not in RETRY_STATUSES
