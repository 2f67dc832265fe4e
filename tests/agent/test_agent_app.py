"""The agent app and its loop, in-process (real SQLite file, real ASGI app, real loop; no mocks)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from agent_support import TOKEN, drained, running, wait_for
from fastapi import Depends

from scanflow.agent import Action, Agent, Context, PermanentError, Store, TemporaryError, get_context
from scanflow.agent.engine import Decision, Intent
from scanflow.settings import Settings


def make_agent(calls: list[tuple[str | None, dict]], fail: dict[str, Any] | None = None) -> Agent:
    a = Agent("checker", role="checker")
    fail = fail if fail is not None else {}

    @a.actuator("plan")
    def plan(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
        calls.append((ctx.key, args))
        if ctx.event is not None:
            ctx.state["last_event"] = ctx.event.name
        ctx.state["plans"] = ctx.state.get("plans", 0) + 1
        if fail.get("temporary", 0) > 0:
            fail["temporary"] -= 1
            raise TemporaryError("not yet", delay_s=0.0)
        if fail.get("permanent"):
            raise PermanentError("never")
        return {"planned": args.get("n", 0)}

    a.strategy(
        "retrain",
        event="drift.*",
        constraint="event.rate > 0.1",
        actions=[Action("plan", args={"n": 1})],
        cooldown_s=0,
    )
    return a


async def test_event_fires_strategy_and_records_decision(store: Store) -> None:
    calls: list = []
    async with running(make_agent(calls), store) as c:
        r = await c.post(
            "/events", json={"name": "drift.checked", "payload": {"rate": 0.5}, "idempotency_key": "e1"}
        )
        assert r.status_code == 202 and r.json() == {"id": 1, "duplicate": False}
        r = await c.post(
            "/events", json={"name": "drift.checked", "payload": {"rate": 0.5}, "idempotency_key": "e1"}
        )
        assert r.json() == {"id": 1, "duplicate": True}
        await c.post("/events", json={"name": "drift.checked", "payload": {"rate": 0.0}})
        await drained(c)
        assert calls == [("retrain:1:0", {"n": 1})]
        decisions = (await c.get("/decisions")).json()
        assert [(d["event_id"], d["result"], d["reason"]) for d in decisions] == [
            (2, "skipped", "false"),
            (1, "fired", "fired"),
        ]
        # what the action returned is on the decision: the operator sees what it did
        assert decisions[1]["outcomes"] == {"retrain:1:0": {"status": "ok", "error": None,
                                                            "result": {"planned": 1}}}
        assert decisions[1]["inputs"]["event"] == {"rate": 0.5}
        status = (await c.get("/status")).json()
        assert (
            status["state"] == {"plans": 1, "last_event": "drift.checked"}
            and status["queue_depth"] == 0
            and status["role"] == "checker"
        )
        metrics = (await c.get("/metrics")).text
        assert 'scanflow_agent_decisions_total{result="fired"} 1.0' in metrics
        assert "scanflow_agent_handler_seconds_bucket" in metrics
    assert store.get("agent_state") == {"plans": 1, "last_event": "drift.checked"}  # saved after the handler


async def test_temporary_errors_are_retried_with_the_same_key(store: Store) -> None:
    calls: list = []
    async with running(make_agent(calls, {"temporary": 2}), store) as c:
        await c.post("/events", json={"name": "drift.x", "payload": {"rate": 1}})
        await drained(c)
    assert [k for k, _ in calls] == ["retrain:1:0"] * 3
    rec = store.get_action("retrain:1:0")
    assert rec is not None and rec.status == "succeeded" and rec.attempts == 3


async def test_retries_are_bounded_then_failed(store: Store) -> None:
    calls: list = []
    async with running(make_agent(calls, {"temporary": 100}), store) as c:
        await c.post("/events", json={"name": "drift.x", "payload": {"rate": 1}})
        await drained(c)
        d = (await c.get("/decisions")).json()[0]
    assert len(calls) == 3  # max_attempts default
    assert d["outcomes"]["retrain:1:0"]["status"] == "failed"
    assert store.get_action("retrain:1:0").status == "failed"  # type: ignore[union-attr]


async def test_permanent_error_is_not_retried_and_loop_goes_on(store: Store) -> None:
    calls: list = []
    fail = {"permanent": True}
    async with running(make_agent(calls, fail), store) as c:
        await c.post("/events", json={"name": "drift.x", "payload": {"rate": 1}})
        await drained(c)
        fail["permanent"] = False
        await c.post("/events", json={"name": "drift.x", "payload": {"rate": 1}})
        await drained(c)
    assert [k for k, _ in calls] == ["retrain:1:0", "retrain:2:0"]
    assert store.get_action("retrain:2:0").status == "succeeded"  # type: ignore[union-attr]


async def test_restart_resumes_without_repeating_finished_actions(store: Store) -> None:
    """As if killed: event 1 decided with its first action done and its second started; event 2 not decided."""
    calls: list = []
    agent = make_agent(calls)
    agent.strategy(
        "two", event="multi", actions=[Action("plan", args={"n": 1}), Action("plan", args={"n": 2})]
    )
    e1, _ = store.add_event("multi", {}, key="a")
    e2, _ = store.add_event("multi", {}, key="b")
    i0 = Intent(f"two:{e1}:0", "two", e1, 0, Action("plan", None, {"n": 1}))
    i1 = Intent(f"two:{e1}:1", "two", e1, 1, Action("plan", None, {"n": 2}))
    store.record_plan(e1, [Decision(e1, "multi", "two", "True", "fired", "fired", {}, (i0, i1), 0.0)], {})
    store.start_action(i0.key, "plan", None, {"n": 1}, e1, 0.0)
    store.finish_action(i0.key, "succeeded", {"planned": 1}, None, 0.0)
    store.start_action(i1.key, "plan", None, {"n": 2}, e1, 0.0)  # killed mid-way
    async with running(agent, store) as c:
        await drained(c)
    assert [k for k, _ in calls] == [f"two:{e1}:1", f"two:{e2}:0", f"two:{e2}:1"]
    assert store.get_action(i1.key).attempts == 2  # type: ignore[union-attr]


async def test_actuator_endpoint_is_idempotent_and_maps_outcomes(store: Store) -> None:
    calls: list = []
    fail: dict[str, Any] = {}
    async with running(make_agent(calls, fail), store) as c:
        ev = {"name": "drift.remote", "payload": {"rate": 1}, "id": 9, "source": "peer"}
        ok = await c.post("/actuators/plan", json={"args": {"n": 5}, "idempotency_key": "k", "event": ev})
        again = await c.post("/actuators/plan", json={"args": {"n": 5}, "idempotency_key": "k"})
        assert ok.json() == {"status": "succeeded", "result": {"planned": 5}, "key": "k", "duplicate": False}
        assert again.json()["duplicate"] is True and len(calls) == 1
        assert (await c.get("/status")).json()["state"]["last_event"] == "drift.remote"
        bad_event = {"args": {}, "event": {"name": "x", "payload": 3}}
        assert (await c.post("/actuators/plan", json=bad_event)).status_code == 422
        fail["temporary"] = 1
        r = await c.post("/actuators/plan", json={"args": {}, "idempotency_key": "t"})
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        r = await c.post(
            "/actuators/plan", json={"args": {}, "idempotency_key": "t"}
        )  # retried: now succeeds
        assert r.status_code == 200
        fail["permanent"] = True
        r = await c.post("/actuators/plan", json={"args": {}})
        assert r.status_code == 422 and r.json()["detail"] == "never"
        assert (await c.post("/actuators/nope", json={})).status_code == 404
        assert (await c.post("/actuators/plan", json={"args": [1]})).status_code == 422


async def test_concurrent_calls_with_one_key_run_the_actuator_once(store: Store) -> None:
    a = Agent("slow")
    runs: list[str] = []

    @a.actuator("work")
    async def work(ctx: Context, args: dict) -> dict:
        runs.append(ctx.key or "")
        await asyncio.sleep(0.05)
        return {"ok": 1}

    async with running(a, store) as c:
        rs = await asyncio.gather(
            *[c.post("/actuators/work", json={"idempotency_key": "same"}) for _ in range(5)]
        )
    assert [r.status_code for r in rs] == [200] * 5
    assert runs == ["same"] and sum(r.json()["duplicate"] for r in rs) == 4


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ({"name": "x", "payload": [1, 2]}, 422, "valid dictionary"),
        ({"payload": {}}, 422, "name"),
        ({"name": "bad name!", "payload": {}}, 422, "pattern"),
        ({"name": "x", "extra": 1}, 422, "extra"),
        ({"name": "x", "idempotency_key": ""}, 422, "idempotency_key"),
    ],
)
async def test_malformed_events_get_422_with_a_message(
    store: Store, body: dict, status: int, fragment: str
) -> None:
    async with running(make_agent([]), store) as c:
        r = await c.post("/events", json=body)
    assert r.status_code == status
    assert fragment in str(r.json()["detail"])


async def test_auth_body_limit_and_not_json(store: Store) -> None:
    async with running(make_agent([]), store, max_body_bytes=1000) as c:
        ev = {"name": "x", "payload": {}}
        assert (await c.post("/events", json=ev, headers={"Authorization": ""})).status_code == 401
        assert (
            await c.post("/events", json=ev, headers={"Authorization": "Bearer wrong"})
        ).status_code == 401
        assert (await c.get("/status", headers={"Authorization": ""})).status_code == 200  # reads are open
        big = {"name": "x", "payload": {"blob": "a" * 5000}}
        r = await c.post("/events", json=big)
        assert r.status_code == 413 and "1000 bytes" in r.json()["detail"]
        r = await c.post("/events", content=b"{not json", headers={"Content-Type": "application/json"})
        assert r.status_code == 422
    async with running(make_agent([]), store, settings=Settings(token=None)) as c:
        r = await c.post("/events", json={"name": "x"})
        assert r.status_code == 403 and "SCANFLOW_TOKEN" in r.json()["detail"]
    async with running(make_agent([]), store, settings=Settings(token=None), allow_anonymous=True) as c:
        assert (await c.post("/events", json={"name": "x"})).status_code == 202


async def test_strategies_over_rest_are_validated_and_persisted(store: Store) -> None:
    calls: list = []
    spec = {
        "name": "rest",
        "event": "load.*",
        "constraint": "event.qps > 100",
        "actions": [{"actuator": "plan"}],
    }
    async with running(make_agent(calls), store, peers={"executor": "http://127.0.0.1:9"}) as c:
        bad = dict(spec, constraint="__import__('os').system('x')")
        r = await c.post("/strategies", json=bad)
        assert r.status_code == 422 and "not allowed" in r.json()["detail"]
        assert (await c.post("/strategies", json=dict(spec, constraint="nope > 1"))).status_code == 422
        r = await c.post("/strategies", json=dict(spec, actions=[{"actuator": "missing"}]))
        assert r.status_code == 422 and "no such actuator" in r.json()["detail"]
        r = await c.post("/strategies", json=dict(spec, actions=[{"actuator": "x", "agent": "ghost"}]))
        assert r.status_code == 422 and "unknown peer" in r.json()["detail"]
        assert (await c.post("/strategies", json=dict(spec, cooldown_s=-1))).status_code == 422
        assert (await c.post("/strategies", json=spec)).status_code == 201
        assert (await c.post("/strategies", json=spec)).status_code == 409
        names = [s["name"] for s in (await c.get("/strategies")).json()]
        assert names == ["retrain", "rest"]
    async with running(make_agent(calls), store) as c:  # a restart keeps the REST strategy
        await c.post("/events", json={"name": "load.high", "payload": {"qps": 500}})
        await drained(c)
        assert calls and calls[-1][0] == "rest:1:0"
        assert (await c.delete("/strategies/rest")).status_code == 204
        assert (await c.delete("/strategies/rest")).status_code == 404
    async with running(make_agent(calls), store) as c:
        assert [s["name"] for s in (await c.get("/strategies")).json()] == ["retrain"]


async def test_sensors_run_on_their_interval_and_on_demand_with_dedup_keys(store: Store) -> None:
    a = make_agent([])
    ticks: list[int] = []

    @a.sensor(every=0.05)
    async def poll(ctx: Context) -> list:
        ticks.append(1)
        return [("drift.checked", {"rate": 0.0}), Event_like("probe", {"i": len(ticks)})]

    @a.sensor(every=0)
    def manual(ctx: Context) -> tuple:
        return ("manual.ran", {"ok": True})

    async with running(a, store) as c:

        async def two_ticks() -> bool:
            return len(ticks) >= 2

        await wait_for(two_ticks, 5, "two sensor ticks")
        r = await c.post("/sensors/manual")
        assert r.status_code == 200 and len(r.json()["events"]) == 1
        assert (await c.post("/sensors/ghost")).status_code == 404
        await drained(c)
        events = (await c.get("/events", params={"limit": 1000})).json()
    keys = {e["idempotency_key"] for e in events}
    assert "sensor:poll:1:0" in keys and "sensor:poll:1:1" in keys and "sensor:manual:1:0" in keys
    assert store.get("sensor_watermark:manual")["tick"] == 1


def Event_like(name: str, payload: dict) -> dict:
    return {"name": name, "payload": payload}


async def test_handler_exceptions_never_kill_the_loop(store: Store) -> None:
    a = Agent("fragile")
    done: list[int] = []

    @a.actuator("act")
    def act(ctx: Context, args: dict) -> Any:
        if args["i"] == 0:
            raise ZeroDivisionError("boom")
        if args["i"] == 1:
            return "not a dict"
        done.append(args["i"])
        return {}

    for i in range(3):
        a.strategy(f"s{i}", event=f"e{i}", actions=[Action("act", args={"i": i})])
    async with running(a, store) as c:
        for i in range(3):
            await c.post("/events", json={"name": f"e{i}"})
        await drained(c)
        outcomes = {d["strategy"]: d["outcomes"] for d in (await c.get("/decisions")).json()}
    assert done == [2]
    assert (
        outcomes["s0"]["s0:1:0"]["status"] == "failed"
        and "ZeroDivisionError" in outcomes["s0"]["s0:1:0"]["error"]
    )
    assert "must return a dict" in outcomes["s1"]["s1:2:0"]["error"]


async def test_custom_routes_use_context_and_token_for_writes(store: Store) -> None:
    a = make_agent([])

    @a.router.post("/predictions")
    async def predictions(body: dict, ctx: Context = Depends(get_context)) -> dict:  # noqa: B008
        eid = await ctx.emit("predictions.logged", {"count": len(body.get("rows", []))})
        return {"event": eid}

    @a.router.get("/hello")
    async def hello(ctx: Context = Depends(get_context)) -> dict:  # noqa: B008
        return {"agent": ctx.name}

    async with running(a, store) as c:
        assert (await c.get("/hello", headers={"Authorization": ""})).json() == {"agent": "checker"}
        assert (
            await c.post("/predictions", json={"rows": [1]}, headers={"Authorization": ""})
        ).status_code == 401
        r = await c.post("/predictions", json={"rows": [1, 2]})
        assert r.status_code == 200
        ev = (await c.get("/events")).json()[0]
        assert (
            ev["name"] == "predictions.logged" and ev["payload"] == {"count": 2} and ev["source"] == "checker"
        )


async def test_since_follows_successes_and_clock_is_injectable(store: Store) -> None:
    now = [1000.0]
    a = make_agent([])
    a.strategy("guarded", event="go", constraint="since('plan') > 100", actions=[Action("plan")])
    async with running(a, store, clock=lambda: now[0]) as c:
        await c.post("/events", json={"name": "go"})  # never planned: since = inf -> fires
        await drained(c)
        now[0] += 50
        await c.post("/events", json={"name": "go"})  # 50 s later -> false
        await drained(c)
        now[0] += 60
        await c.post("/events", json={"name": "go"})  # 110 s after -> fires
        await drained(c)
        reasons = [d["reason"] for d in (await c.get("/decisions", params={"strategy": "guarded"})).json()]
    assert reasons == ["fired", "false", "fired"][::-1]


def test_agent_definition_errors_are_clear() -> None:
    from scanflow.agent import AgentDefinitionError

    with pytest.raises(AgentDefinitionError, match="DNS label"):
        Agent("Bad Name")
    a = Agent("ok")
    with pytest.raises(AgentDefinitionError, match="unknown name"):
        a.strategy("s", event="x", constraint="os > 1", actions=["act"])
    with pytest.raises(AgentDefinitionError, match="actions"):
        a.strategy("s2", event="x", actions=[])
    a.strategy("s3", event="x", actions=["missing"])
    with pytest.raises(AgentDefinitionError, match="does not have"):
        a.check()

    @a.actuator("act")
    def act(ctx: Context, args: dict) -> dict:
        return {}

    with pytest.raises(AgentDefinitionError, match="already registered"):
        a.actuator("act")(act)


async def test_unhandled_errors_are_json_500_without_the_exception_text(store: Store) -> None:
    import httpx

    from scanflow.agent import create_app

    a = make_agent([])

    @a.router.get("/explode")
    async def explode() -> dict:
        raise RuntimeError("password=hunter2")

    app = create_app(a, Settings(token=TOKEN), store=store)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://agent") as c:
            r = await c.get("/explode")
    assert r.status_code == 500
    assert "hunter2" not in r.text and "error_id" in r.json()


async def test_ready_answers_while_the_store_does_and_503_when_it_does_not(store: Store) -> None:
    agent = make_agent([])
    async with running(agent, store) as client:
        r = await client.get("/ready")
        assert r.status_code == 200 and r.json()["status"] == "ready" and r.json()["agent"] == agent.name

        def broken(*_a: Any, **_k: Any) -> int:
            raise OSError("connection refused")

        store.count_events = broken  # type: ignore[method-assign]  # the database is gone (a restart, a lost volume)
        r = await client.get("/ready")
        assert r.status_code == 503, r.text
        assert r.json() == {"status": "unready", "agent": agent.name, "reason": "store: OSError"}
        assert (await client.get("/health")).status_code == 200  # alive: no restart for this
