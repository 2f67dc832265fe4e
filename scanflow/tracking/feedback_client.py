"""Clients of the Tracker's feedback endpoints: post true labels, look them up by request_id.

Who calls: agents that retrain (`lookup_feedback` from worker threads, `alookup_feedback` from async
actuators) to join the labels to the logged predictions they pick; clients that learn the truth
(`post_feedback`; scanflow.embedded.traffic posts through it from its own thread).

Every call has a timeout and bounded retries with exponential backoff and jitter (tenacity, as
scanflow.agent.client does) on what may pass: connection errors, timeouts, 5xx and 429. A 4xx raises
`AgentHTTPError` at once with the Tracker's message. Re-posting is safe: the Tracker stores each
request_id once. Large calls are cut into chunks within the router's limits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import httpx
from pydantic import SecretStr
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from scanflow.agent.client import AgentHTTPError, raise_for_status
from scanflow.auth import bearer_header

LOOKUP_CHUNK = 5_000  # ids per POST /feedback/lookup (the router takes up to 10,000)
POST_CHUNK = 1_000  # records per POST /feedback (the router takes up to 5,000)
TIMEOUT_S = 10.0
RETRIES = 3
BACKOFF_S = 0.2
MAX_BACKOFF_S = 5.0


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, AgentHTTPError):
        return exc.retryable
    return isinstance(exc, httpx.TransportError)


def _checked(r: httpx.Response, what: str) -> Any:
    """The decoded JSON body, or AgentHTTPError carrying the Tracker's `detail`."""
    raise_for_status(r, what)
    return r.json()


def _chunks(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _policy(retries: int, backoff_s: float) -> dict[str, Any]:
    return {
        "stop": stop_after_attempt(retries + 1),
        "wait": wait_exponential_jitter(initial=backoff_s, max=MAX_BACKOFF_S),
        "retry": retry_if_exception(_retryable),
        "reraise": True,
    }


def _post_sync(http: httpx.Client, url: str, body: Any, headers: dict[str, str], retries: int,
               backoff_s: float) -> Any:
    for attempt in Retrying(**_policy(retries, backoff_s)):
        with attempt:
            return _checked(http.post(url, json=body, headers=headers), f"POST {url}")
    raise AssertionError("unreachable")  # pragma: no cover


def lookup_feedback(
    tracker_url: str,
    token: SecretStr | str | None,
    request_ids: Iterable[str],
    *,
    timeout_s: float = TIMEOUT_S,
    retries: int = RETRIES,
    backoff_s: float = BACKOFF_S,
) -> dict[str, list[Any]]:
    """request_id -> true labels for the ids that have feedback (ids without any are left out).
    Blocking: for worker threads. Raises AgentHTTPError (4xx, or retries spent) or httpx errors."""
    ids = list(dict.fromkeys(request_ids))
    url = f"{tracker_url.rstrip('/')}/feedback/lookup"
    out: dict[str, list[Any]] = {}
    if not ids:
        return out
    with httpx.Client(headers=bearer_header(token), timeout=timeout_s) as http:
        for chunk in _chunks(ids, LOOKUP_CHUNK):
            out.update(_post_sync(http, url, {"request_ids": list(chunk)}, {}, retries, backoff_s)["labels"])
    return out


async def alookup_feedback(
    tracker_url: str,
    token: SecretStr | str | None,
    request_ids: Iterable[str],
    *,
    timeout_s: float = TIMEOUT_S,
    retries: int = RETRIES,
    backoff_s: float = BACKOFF_S,
) -> dict[str, list[Any]]:
    """`lookup_feedback` for async callers (actuators, strategies): the same call on a worker thread, so
    the same answer and the same errors, without blocking the event loop."""
    return await asyncio.to_thread(lookup_feedback, tracker_url, token, list(request_ids), timeout_s=timeout_s,
                                   retries=retries, backoff_s=backoff_s)


def post_feedback(
    tracker_url: str,
    token: SecretStr | str | None,
    records: Sequence[Mapping[str, Any]],
    *,
    timeout_s: float = TIMEOUT_S,
    retries: int = RETRIES,
    backoff_s: float = BACKOFF_S,
    http: httpx.Client | None = None,
) -> dict[str, int]:
    """Post feedback records ({request_id, labels[, ts]}), POST_CHUNK per request. Blocking.

    Returns the summed {accepted, stored, duplicates}. `http`: a client to reuse (a sender posting
    in a loop); its timeout applies then, and the token is sent with each request all the same. A 4xx (a malformed record: the message names
    its index and field) raises AgentHTTPError without retrying; chunks before it stay stored.
    """
    url = f"{tracker_url.rstrip('/')}/feedback"
    total = {"accepted": 0, "stored": 0, "duplicates": 0}
    if not records:
        return total
    own = http is None
    client = httpx.Client(timeout=timeout_s) if http is None else http
    headers = bearer_header(token)
    try:
        for chunk in _chunks(records, POST_CHUNK):
            got = _post_sync(client, url, [dict(r) for r in chunk], headers, retries, backoff_s)
            for k in total:
                total[k] += int(got[k])
    finally:
        if own:
            client.close()
    return total


def lookup_labels(ctx: Any, request_ids: Iterable[str]) -> dict[str, list[Any]]:
    """From inside an agent's action: the labels of `request_ids` at the Tracker (its `tracker` peer, this
    agent's token). PermanentError without a Tracker peer; TemporaryError while it cannot answer (the
    action is retried, nothing decided meanwhile). Blocking: call it from sync actuators (worker threads)."""
    from scanflow.agent import PermanentError, TemporaryError

    url = ctx.peers.get("tracker")
    if url is None:
        raise PermanentError(f"{ctx.name} needs the Tracker as a peer (--peer tracker=URL) to read feedback labels")
    token = ctx.settings.token.get_secret_value() if ctx.settings.token else None
    try:
        return lookup_feedback(url, token, request_ids)
    except (AgentHTTPError, httpx.HTTPError) as exc:
        raise TemporaryError(f"feedback lookup at the Tracker failed: {exc}", delay_s=2.0) from None
