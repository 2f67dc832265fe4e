"""A durable outbox: an actuator queues an event for a peer and returns at once; a sensor delivers it.

Why: an actuator that sends to a peer with `ctx.send_event` and retries while the peer is down holds
the agent's inbox loop for as long as its retries last (the loop runs one event's actions at a time),
so a Planner waiting for a restarting Executor could not act on anything else for minutes. With the
outbox the actuator only writes the message into the agent's durable store (key `outbox`) and
succeeds; `deliver` (run by a sensor on its own task) posts queued messages in order, each with its
own idempotency key, and removes a message only after the peer's inbox accepted it. A crash between
the post and the removal re-posts the same key, which the peer's inbox deduplicates: exactly once.
Order is kept per peer (a message is never posted before an earlier one to the same peer).
Who calls: agents/checker.py (`forward`), agents/planner.py (plans for the Executor).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from typing import Any

from scanflow.agent import Context, PermanentError
from scanflow.agent.client import AgentHTTPError

STORE_KEY = "outbox"
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
    """Post queued messages in order; stop for a peer at its first failure. Returns what happened."""
    box = await asyncio.to_thread(_pending, ctx)
    sent: list[str] = []
    dropped: list[str] = []
    blocked: set[str] = set()
    for key, msg in list(box.items())[:max_messages]:
        to = str(msg["to"])
        if to in blocked:
            continue
        try:
            await ctx.client(to).post_event(str(msg["name"]), dict(msg["payload"]), key=key, source=ctx.name)
            sent.append(key)
        except AgentHTTPError as exc:
            if exc.retryable:
                blocked.add(to)
            else:  # the peer refuses it for good (4xx): keeping it would block every later message
                ctx.log.error("outbox: %s refused %s (%s): dropped", to, msg["name"], exc)
                dropped.append(key)
        except PermanentError as exc:
            ctx.log.error("outbox: %s: dropped", exc)
            dropped.append(key)
        except Exception as exc:  # noqa: BLE001 - peer down or slow: try again on the next tick
            ctx.log.info("outbox: %s unreachable (%s: %s); %s waits", to, type(exc).__name__, exc, msg["name"])
            blocked.add(to)
    if sent or dropped:
        await asyncio.to_thread(_remove, ctx, sent + dropped)
    return {"sent": len(sent), "dropped": len(dropped), "waiting": len(box) - len(sent) - len(dropped)}
