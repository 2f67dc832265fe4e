"""A durable outbox: an actuator queues an event for a peer and returns at once; a sensor delivers it.

Why: an actuator that sends to a peer with `ctx.send_event` and retries while the peer is down holds
the agent's inbox loop for as long as its retries last (the loop runs one event's actions at a time),
so a Planner waiting for a restarting Executor could not act on anything else for minutes. With the
outbox the actuator only writes the message into the agent's durable store (key `outbox`) and
succeeds; `deliver` (run by a sensor on its own task) posts queued messages in order, each with its
own idempotency key, and removes a message only after the peer's inbox accepted it. A crash between
the post and the removal re-posts the same key, which the peer's inbox deduplicates: exactly once.
Order is kept per peer (a message is never posted before an earlier one to the same peer).
What the peer can never take (a payload JSON cannot carry, such as NaN; or a 400/413/422 refusal) moves
to a dead-letter map in the store (key `outbox_dead`, with the reason) so it never blocks the queue
and stays visible. A rejected token (401/403) is an operator's problem, not the message's: the message
is kept and retried with backoff, and every refusal is logged loudly.
Who calls: scanflow/standard/checker.py (`forward`), scanflow/standard/planner.py (plans for the Executor).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping
from typing import Any

from scanflow.agent import Context, PermanentError
from scanflow.agent.client import AgentHTTPError
from scanflow.agent.jsonsafe import to_json_value

STORE_KEY = "outbox"
DEAD_KEY = "outbox_dead"
DEAD_STATUS = frozenset({400, 413, 422})  # the peer says this message is malformed: it never passes
AUTH_STATUS = frozenset({401, 403})
AUTH_BACKOFF_S = (1.0, 30.0)  # first and longest wait before re-posting to a peer that rejected the token
_auth_wait: dict[tuple[str, str], tuple[float, float]] = {}  # (agent, peer) -> (retry at, last delay)
_lock = threading.Lock()  # the store's read-modify-write of the outbox runs in worker threads


def _add(ctx: Context, key: str, msg: dict[str, Any]) -> bool:
    with _lock:
        box = dict(ctx.store.get(STORE_KEY, {}) or {})
        if key in box:
            return False
        box[key] = msg
        ctx.store.put(STORE_KEY, box)
        return True


def _remove(ctx: Context, keys: list[str]) -> None:
    with _lock:
        box = dict(ctx.store.get(STORE_KEY, {}) or {})
        for k in keys:
            box.pop(k, None)
        ctx.store.put(STORE_KEY, box)


def _dead_letter(ctx: Context, dead: dict[str, str], now: float) -> None:
    """Move messages from the outbox to the dead-letter map, each with why (one store write)."""
    with _lock:
        box = dict(ctx.store.get(STORE_KEY, {}) or {})
        graveyard = dict(ctx.store.get(DEAD_KEY, {}) or {})
        for k, reason in dead.items():
            msg = box.pop(k, None)
            if msg is not None:
                graveyard[k] = {**msg, "payload": _storable(msg.get("payload")), "error": reason, "dead_at": now}
        ctx.store.put_many([(STORE_KEY, box), (DEAD_KEY, graveyard)])


def _storable(payload: Any) -> Any:
    try:
        return to_json_value(payload)
    except ValueError:
        return repr(payload)[:2000]  # kept for a person to read; it could never be sent anyway


def dead_letters(ctx: Context) -> dict[str, dict[str, Any]]:
    """What the outbox gave up on, by key: the message, `error` (why) and `dead_at`."""
    with _lock:
        return dict(ctx.store.get(DEAD_KEY, {}) or {})


def _pending(ctx: Context) -> dict[str, dict[str, Any]]:
    with _lock:
        return dict(ctx.store.get(STORE_KEY, {}) or {})


async def enqueue(ctx: Context, to: str, name: str, payload: Mapping[str, Any], tag: str = "") -> str:
    """Queue event `name` for peer `to`; returns its idempotency key (derived from the action's key,
    so a re-run of the same action after a crash queues nothing new)."""
    if to not in ctx.peers:
        raise PermanentError(f"unknown peer agent {to!r}; known peers: {sorted(ctx.peers)}")
    if ctx.key is None:
        raise PermanentError("the outbox needs an action key (call it from an actuator)")
    key = f"{ctx.key}:outbox:{to}:{name}{':' + tag if tag else ''}"
    await asyncio.to_thread(_add, ctx, key, {"to": to, "name": name, "payload": dict(payload),
                                             "queued_at": ctx.now()})
    return key


async def deliver(ctx: Context, max_messages: int = 50) -> dict[str, Any]:
    """Post queued messages in order; stop for a peer at its first failure. Returns what happened:
    counts of `sent`, `dead` (moved to the dead letters), `waiting`, and `auth_rejected` peers."""
    box = await asyncio.to_thread(_pending, ctx)
    sent: list[str] = []
    dead: dict[str, str] = {}
    blocked: set[str] = set()
    rejected: set[str] = set()
    for key, msg in list(box.items())[:max_messages]:
        to = str(msg["to"])
        if to in blocked:
            continue
        wait = _auth_wait.get((ctx.name, to))
        if wait is not None and time.monotonic() < wait[0]:
            blocked.add(to)
            continue
        try:
            payload = to_json_value(dict(msg["payload"]), f"event {msg['name']!r} payload")
        except (ValueError, TypeError) as exc:  # can never be encoded: retrying would block the queue
            ctx.log.error("outbox: %s for %s cannot be sent (%s): moved to the dead letters", msg["name"], to, exc)
            dead[key] = f"not JSON: {exc}"
            continue
        try:
            await ctx.client(to).post_event(str(msg["name"]), payload, key=key, source=ctx.name)
            sent.append(key)
            _auth_wait.pop((ctx.name, to), None)
        except AgentHTTPError as exc:
            if exc.status in DEAD_STATUS:
                ctx.log.error("outbox: %s refused %s (%s): moved to the dead letters", to, msg["name"], exc)
                dead[key] = f"refused by {to}: HTTP {exc.status}: {exc.detail}"
            elif exc.status in AUTH_STATUS:
                ctx.log.error("outbox: token rejected by %s (HTTP %d); %s kept, will retry: check the "
                              "agents share SCANFLOW_TOKEN", to, exc.status, msg["name"])
                blocked.add(to)
                rejected.add(to)
                last = wait[1] if wait is not None else AUTH_BACKOFF_S[0] / 2
                delay = min(last * 2, AUTH_BACKOFF_S[1])
                _auth_wait[(ctx.name, to)] = (time.monotonic() + delay, delay)
            else:  # down, busy, or a status that may change (404 while a peer restarts...): retry later
                ctx.log.warning("outbox: %s answered %s; %s waits", to, exc, msg["name"])
                blocked.add(to)
        except PermanentError as exc:
            ctx.log.error("outbox: %s: moved to the dead letters", exc)
            dead[key] = str(exc)
        except Exception as exc:  # noqa: BLE001 - peer down or slow: try again on the next tick
            ctx.log.info("outbox: %s unreachable (%s: %s); %s waits", to, type(exc).__name__, exc, msg["name"])
            blocked.add(to)
    if sent:
        await asyncio.to_thread(_remove, ctx, sent)
    if dead:
        await asyncio.to_thread(_dead_letter, ctx, dead, ctx.now())
    return {"sent": len(sent), "dead": len(dead), "waiting": len(box) - len(sent) - len(dead),
            "auth_rejected": sorted(rejected)}
