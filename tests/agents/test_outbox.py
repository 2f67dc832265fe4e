"""The durable outbox of the reference agents: an actuator queues and returns even while the peer is
down; the sensor delivers in order, exactly once (the peer's inbox deduplicates a re-post)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
from agents_support import TOKEN, served

from scanflow.agent import Agent, Context, Store, create_app
from scanflow.agentkit import outbox
from scanflow.settings import Settings


def _sender(deliver_every: float) -> Agent:
    a = Agent("sender", role="sender")

    @a.actuator("send")
    async def send(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
        return {"key": await outbox.enqueue(ctx, "recv", "plan.approved", args)}

    @a.sensor(every=deliver_every)
    async def deliver(ctx: Context) -> None:
        await outbox.deliver(ctx)

    return a


def _receiver() -> Agent:
    return Agent("recv", role="recv")


async def _wait(cond, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if await cond():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def test_queued_while_peer_down_then_delivered_once_in_order(tmp_path, port) -> None:  # type: ignore[no-untyped-def]
    store = Store(f"sqlite:///{tmp_path / 'sender.db'}")
    app = create_app(_sender(0.1), Settings(token=TOKEN), store=store, peers={"recv": f"http://127.0.0.1:{port}"},
                     retry_backoff_s=0.01)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        async with (app.router.lifespan_context(app),
                    httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://a", headers=auth) as c):
            t0 = time.monotonic()
            for i in range(3):  # the peer is down: each call still answers at once
                r = await c.post("/actuators/send", json={"args": {"plan": "route", "n": i}, "idempotency_key": f"k{i}"})
                assert r.status_code == 200, r.text
            assert time.monotonic() - t0 < 5.0
            assert len(store.get(outbox.STORE_KEY, {})) == 3
            # the same action key again (a retry after a crash) queues nothing new
            await c.post("/actuators/send", json={"args": {"plan": "route", "n": 0}, "idempotency_key": "k0"})
            assert len(store.get(outbox.STORE_KEY, {})) == 3

            async with served(_receiver(), tmp_path, port) as rstore:
                async def all_in() -> bool:
                    return rstore.count_events() == 3 and not store.get(outbox.STORE_KEY, {})

                await _wait(all_in, 20, "the three queued events in the receiver's inbox")
                events = sorted(rstore.list_events(limit=10), key=lambda e: e["id"])
                assert [e["payload"]["n"] for e in events] == [0, 1, 2]
                # a re-post of a delivered key (crash between post and removal) is a duplicate
                async with httpx.AsyncClient(headers=auth) as raw:
                    key = events[0]["idempotency_key"]
                    assert key.startswith("k0:outbox:recv:")
                    r = await raw.post(f"http://127.0.0.1:{port}/events",
                                       json={"name": "plan.approved", "payload": {}, "idempotency_key": key})
                    assert r.json()["duplicate"] is True
                assert rstore.count_events() == 3
    finally:
        store.close()
