"""Routing decisions of the gateway, as pure functions over plain state (no I/O, no clock).

Who calls: scanflow.serving.gateway, on every request (`choose`) and after every health round
(`route_of`). Kept apart so the rules (least outstanding, skip unhealthy, failover to the backup when
the primary set has no healthy replica, explicit override) are unit-tested without a network.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

RouteMode = Literal["primary", "backup", "auto"]
Target = Literal["primary", "backup"]


@dataclass(eq=False)
class Upstream:
    """One upstream (a replica, or the backup endpoint) as the gateway sees it."""

    url: str
    healthy: bool = False
    outstanding: int = 0
    requests: int = 0
    errors: int = 0
    last_error: str | None = None

    def snapshot(self) -> dict[str, object]:
        return {
            "url": self.url,
            "healthy": self.healthy,
            "outstanding": self.outstanding,
            "requests": self.requests,
            "errors": self.errors,
            "last_error": self.last_error,
        }


def normalize_url(url: str) -> str:
    """'http://h:p/' -> 'http://h:p'; ValueError (-> 422) for anything that is not http(s)://host."""
    u = url.strip().rstrip("/")
    scheme, sep, rest = u.partition("://")
    if not sep or scheme not in ("http", "https") or not rest or " " in rest:
        raise ValueError(f"{url!r} is not an http(s) URL such as http://127.0.0.1:8001")
    if "?" in rest or "#" in rest:  # the gateway appends paths: a query or fragment would swallow them
        raise ValueError(f"{url!r} must not have a query or a fragment: give the base URL, e.g. http://host:8001")
    return u


def pick_least_outstanding(replicas: Sequence[Upstream], exclude: frozenset[str], tick: int) -> Upstream | None:
    """The healthy replica with the fewest requests in flight; ties rotate with `tick` (round robin)."""
    best: Upstream | None = None
    n = len(replicas)
    for i in range(n):
        r = replicas[(tick + i) % n]
        if r.healthy and r.url not in exclude and (best is None or r.outstanding < best.outstanding):
            best = r
    return best


def route_of(mode: RouteMode, primary_healthy: bool, has_backup: bool) -> Target | None:
    """Where traffic goes: the override if set, else primary while it has a healthy replica, else backup."""
    if mode == "primary":
        return "primary"
    if mode == "backup":
        return "backup" if has_backup else None
    if primary_healthy:
        return "primary"
    return "backup" if has_backup else None


def choose(
    mode: RouteMode,
    replicas: Sequence[Upstream],
    backup: Upstream | None,
    exclude: frozenset[str],
    tick: int,
) -> tuple[Target | None, Upstream | None]:
    """(route, upstream) for one attempt; upstream None means nowhere to send (answer 503)."""
    replica = pick_least_outstanding(replicas, exclude, tick) if mode != "backup" else None
    route = route_of(mode, replica is not None, backup is not None and backup.url not in exclude)
    if route == "primary":
        return route, replica
    if route == "backup" and backup is not None:
        return route, backup
    return route, None


MAX_ATTEMPTS = 3  # the first try, another replica, then the backup


def choose_attempt(
    mode: RouteMode,
    replicas: Sequence[Upstream],
    backup: Upstream | None,
    exclude: frozenset[str],
    tick: int,
    last: bool,
) -> tuple[Target | None, Upstream | None]:
    """Like `choose`, but the last attempt of a request that already failed goes to a healthy backup.

    Why: when every primary dies at once (all SIGKILLed, a node lost), a request failing on one dying
    primary would otherwise be retried on another primary that still looks healthy (its health check
    has not run yet) and fail again. The backup is the one upstream not dying with them. An explicit
    `primary` route is respected: then the last attempt stays on the primaries.
    """
    if last and exclude and mode != "primary" and backup is not None and backup.healthy and (
        backup.url not in exclude
    ):
        return "backup", backup
    return choose(mode, replicas, backup, exclude, tick)


def pick_for_batch(
    replicas: Sequence[Upstream], inflight: dict[str, int], max_inflight: int, no_batch: set[str], tick: int
) -> Upstream | None:
    """The replica that takes the next coalesced batch: healthy, plain http, speaks /predict_batch, has
    fewer than `max_inflight` batches in flight; fewest outstanding requests first, ties rotate with tick.
    None: wait for a batch to finish (or, when no replica qualifies at all, forward one by one)."""
    best: Upstream | None = None
    n = len(replicas)
    for i in range(n):
        r = replicas[(tick + i) % n]
        if (
            r.healthy
            and inflight.get(r.url, 0) < max_inflight
            and r.url not in no_batch
            and r.url.startswith("http://")
            and (best is None or r.outstanding < best.outstanding)
        ):
            best = r
    return best


def can_batch(replicas: Sequence[Upstream], no_batch: set[str]) -> bool:
    """Some healthy replica could take coalesced batches (else requests are forwarded one by one)."""
    return any(r.healthy and r.url not in no_batch and r.url.startswith("http://") for r in replicas)
