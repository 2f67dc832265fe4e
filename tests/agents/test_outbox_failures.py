"""The outbox under failure: a message that can never be sent (NaN, a 422 from the peer) moves to the
dead letters and never blocks the ones behind it; a rejected token keeps the message for a retry."""

from __future__ import annotations

import math
from typing import Any

import httpx
from agents_support import TOKEN, served

from scanflow.agent import Agent, Context, Store, create_app
from scanflow.agentkit import outbox
from scanflow.settings import Settings


def _sender() -> Agent:
    """Delivery is driven by the test (no sensor), so each `deliver` result can be checked."""
    a = Agent("sender", role="sender")

    @a.actuator("send")
    async def send(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
        name = str(args.pop("name", "plan.approved"))
        if args.pop("inf", False):
            args["latency_ms"] = math.inf  # what the Checker once forwarded for a > 1 s percentile
        return {"key": await outbox.enqueue(ctx, "recv", name, args)}

    return a


async def _call(app: Any, name: str, body: dict[str, Any], token: str) -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://a",
                                 headers={"Authorization": f"Bearer {token}"}) as c:
        r = await c.post(f"/actuators/{name}", json=body)
        assert r.status_code == 200, r.text


async def test_unsendable_messages_go_to_the_dead_letters_and_never_block_the_queue(tmp_path, port) -> None:  # type: ignore[no-untyped-def]
    store = Store(f"sqlite:///{tmp_path / 'sender.db'}")
    app = create_app(_sender(), Settings(token=TOKEN), store=store, peers={"recv": f"http://127.0.0.1:{port}"})
    try:
        async with app.router.lifespan_context(app), served(Agent("recv"), tmp_path, port) as rstore:
            await _call(app, "send", {"args": {"inf": True}}, TOKEN)
            await _call(app, "send", {"args": {"name": "not a valid name!"}}, TOKEN)  # the peer says 422
            await _call(app, "send", {"args": {"n": 1}}, TOKEN)
            ctx = app.state.runtime.ctx
            result = await outbox.deliver(ctx)
            assert (result["sent"], result["dead"], result["waiting"]) == (1, 2, 0)
            assert [e["payload"] for e in rstore.list_events()] == [{"n": 1}]
            dead = outbox.dead_letters(ctx)
            reasons = sorted(d["error"] for d in dead.values())
            assert reasons[0].startswith("not JSON") and "non-finite" in reasons[0]
            assert reasons[1].startswith("refused by recv: HTTP 422")
            assert not store.get(outbox.STORE_KEY)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://a") as c:
                assert (await c.get("/events")).status_code == 200
    finally:
        store.close()


async def test_a_rejected_token_keeps_the_message_until_the_token_is_fixed(tmp_path, port) -> None:  # type: ignore[no-untyped-def]
    store = Store(f"sqlite:///{tmp_path / 'sender.db'}")
    peers = {"recv": f"http://127.0.0.1:{port}"}
    wrong = create_app(_sender(), Settings(token="wrong-token-456"), store=store, peers=peers)
    try:
        async with served(Agent("recv"), tmp_path, port) as rstore:
            async with wrong.router.lifespan_context(wrong):
                await _call(wrong, "send", {"args": {"n": 7}}, "wrong-token-456")
                result = await outbox.deliver(wrong.state.runtime.ctx)
                assert result["auth_rejected"] == ["recv"] and result["waiting"] == 1
                again = await outbox.deliver(wrong.state.runtime.ctx)  # backing off: not re-posted yet
                assert again["waiting"] == 1 and again["auth_rejected"] == []
                assert len(store.get(outbox.STORE_KEY)) == 1 and rstore.count_events() == 0
            outbox._auth_wait.clear()  # the operator fixed the token and restarted the agent
            fixed = create_app(_sender(), Settings(token=TOKEN), store=store, peers=peers)
            async with fixed.router.lifespan_context(fixed):
                result = await outbox.deliver(fixed.state.runtime.ctx)
                assert result["sent"] == 1 and not store.get(outbox.STORE_KEY)
                assert [e["payload"] for e in rstore.list_events()] == [{"n": 7}]
    finally:
        store.close()
