"""Bounded input over REST: constraint bombs -> 422, deep bodies -> 422, GET /events never 500,
code-declared strategies are not deleted, and the agent answers /health while constraints run."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from agent_support import TOKEN, AgentProcess, drained, free_port_for, running, wait_for

from scanflow import expressions
from scanflow.agent import Action, Agent, Context, Store
from scanflow.agent.jsonsafe import MAX_JSON_DEPTH, NotJSONError
from scanflow.agent.store_schema import events as events_table

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def make_agent() -> Agent:
    a = Agent("checker", role="checker")

    @a.actuator("plan")
    def plan(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
        return {}

    a.strategy("in-code", event="drift.*", constraint="event.rate > 0.1", actions=[Action("plan")])
    return a


def nested(depth: int) -> dict[str, Any]:
    """A JSON object `depth` levels deep: {"a": {"a": ... {}}}."""
    top: dict[str, Any] = {}
    cur = top
    for _ in range(depth - 1):
        cur["a"] = {}
        cur = cur["a"]
    return top


def strategy(name: str, constraint: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "event": "drift.*",
        "constraint": constraint,
        "actions": [{"actuator": "plan", "args": args or {}}],
    }


@pytest.mark.parametrize(
    ("constraint", "fragment"),
    [
        ("((((9**64)**64)**64)**64) > 0", "nested powers"),
        ("'a'*10**9", "integer literal only"),
        ("len('a' * event.n) > 0", "integer literal only"),
        ("len([[1] * 1000] * 1000) > 0", "more than 100000"),
        ("'%0999999999d' % 1", "string formatting"),
    ],
)
async def test_constraint_bombs_are_refused_at_registration(
    store: Store, constraint: str, fragment: str
) -> None:
    async with running(make_agent(), store) as c:
        r = await c.post("/strategies", json=strategy("bomb", constraint))
        assert r.status_code == 422 and fragment in r.json()["detail"], r.text
        assert "bomb" not in [s["name"] for s in (await c.get("/strategies")).json()]


async def test_bodies_nested_too_deep_are_refused_naming_the_limit(store: Store) -> None:
    async with running(make_agent(), store) as c:
        ok = nested(MAX_JSON_DEPTH - 1)  # the body is one more level
        assert (await c.post("/events", json={"name": "x", "payload": ok})).status_code == 202
        for depth in (MAX_JSON_DEPTH, 900, 20_000):  # raw text: json.dumps itself stops near 1000
            deep = '{"a": ' * (depth - 1) + "{}" + "}" * (depth - 1)
            for path, body in [
                ("/events", '{"name": "x", "payload": ' + deep + "}"),
                ("/actuators/plan", '{"args": ' + deep + "}"),
                (
                    "/strategies",
                    '{"name": "s", "event": "x", "actions": [{"actuator": "plan", "args": ' + deep + "}]}",
                ),
            ]:
                r = await c.post(path, content=body, headers={"content-type": "application/json"})
                assert r.status_code == 422, (path, depth, r.status_code)
                assert f"the limit is {MAX_JSON_DEPTH} levels" in r.json()["detail"]
        # brackets inside strings nest nothing
        r = await c.post("/events", json={"name": "x", "payload": {"s": "[{" * 5000}})
        assert r.status_code == 202
        assert len((await c.get("/strategies")).json()) == 1


async def test_in_process_events_are_bounded_too(store: Store) -> None:
    with pytest.raises(NotJSONError, match=f"deeper than {MAX_JSON_DEPTH} levels"):
        store.add_event("x", nested(MAX_JSON_DEPTH + 1))
    store.add_event("x", nested(MAX_JSON_DEPTH))


async def test_get_events_never_500_on_rows_stored_before_the_bound(store: Store) -> None:
    # written straight into the table, as an older version let it in
    with store.engine.begin() as conn:
        conn.execute(
            sa.insert(events_table).values(
                name="drift.old",
                payload=nested(900),
                idempotency_key="old",
                status="pending",
                received_at=0.0,
            )
        )
    async with running(make_agent(), store) as c:
        await drained(c)  # the loop decided it: its decision's inputs hold the deep payload too
        for limit in (1, 100, 1000):
            r = await c.get("/events", params={"limit": limit})
            assert r.status_code == 200, r.text
            assert "not shown" in r.text
        r = await c.get("/decisions")
        assert r.status_code == 200 and r.json()[0]["result"] == "error"  # no key 'rate'
        assert "not shown" in r.text


async def test_deleting_a_code_declared_strategy_is_refused_and_a_rest_one_is_durable(store: Store) -> None:
    async with running(make_agent(), store) as c:
        r = await c.delete("/strategies/in-code")
        assert r.status_code == 409 and "declared in the agent's code" in r.json()["detail"]
        assert (await c.post("/strategies", json=strategy("added", "True"))).status_code == 201
        assert (await c.delete("/strategies/added")).status_code == 204
        assert (await c.delete("/strategies/added")).status_code == 404
    async with running(make_agent(), store) as c:  # a restart on the same store
        assert [s["name"] for s in (await c.get("/strategies")).json()] == ["in-code"]


async def test_an_over_budget_constraint_is_recorded_as_an_error(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(expressions, "EVAL_BUDGET_S", 0.001)  # 55 passes over 100,000 items: ~50 ms
    async with running(make_agent(), store) as c:
        heavy = "max(" + ", ".join(["min(event.xs)"] * 55) + ") > 0"
        assert (await c.post("/strategies", json=strategy("heavy", heavy))).status_code == 201
        r = await c.post("/events", json={"name": "drift.x", "payload": {"xs": list(range(100_000))}})
        assert r.status_code == 202, r.text
        await drained(c)

        async def decided() -> bool:
            return any(d["strategy"] == "heavy" for d in (await c.get("/decisions")).json())

        await wait_for(decided, what="the heavy strategy's decision")
        (d,) = [d for d in (await c.get("/decisions")).json() if d["strategy"] == "heavy"]
        assert d["result"] == "error" and "passed its budget of 1 ms of CPU time" in d["reason"]


def heaviest_constant_constraint() -> str:
    """About the most expensive constraint the rules accept without a big payload: 26 passes of
    min() over a 100,000-item list built from a literal (400 nodes; ~33 ms of CPU here)."""
    return "max(" + ", ".join(["min([event.n] * 1000 * 100)"] * 26) + ") > 0"


def evaluation_cost_s(constraint: str, runs: int = 5) -> float:
    """The median wall time of one evaluation of `constraint` in this process, now."""
    expr = expressions.compile_expression(constraint)
    costs = []
    for _ in range(runs):
        t0 = time.perf_counter()
        expr.evaluate(event={"n": 1})
        costs.append(time.perf_counter() - t0)
    return statistics.median(costs)


@pytest.mark.integration
def test_health_answers_while_heavy_constraints_are_evaluated(
    spawn: Callable[..., AgentProcess], tmp_path: Path
) -> None:
    agent = spawn("evaluator", free_port_for(), env={"SCANFLOW_TEST_OUT": str(tmp_path)}).start()
    agent.wait_ready()
    with httpx.Client(base_url=agent.url, headers=AUTH, timeout=30) as c:
        # four strategies on one event: ~4 x 33 ms of evaluation per event, which on the event loop
        # would hold every request behind it for longer than the 100 ms bound
        for i in range(4):
            body = {
                "name": f"heavy-{i}",
                "event": "tick",
                "constraint": heaviest_constant_constraint(),
                "actions": [{"actuator": "noop"}],
            }
            assert c.post("/strategies", json=body).status_code == 201, c.post("/strategies", json=body).text
        stop = threading.Event()
        posted = 0

        def stream() -> None:
            nonlocal posted
            with httpx.Client(base_url=agent.url, headers=AUTH, timeout=30) as p:
                while not stop.is_set() and posted < 200:
                    assert (
                        p.post("/events", json={"name": "tick", "payload": {"n": posted}}).status_code == 202
                    )
                    posted += 1

        def decided() -> int:
            return len(c.get("/decisions", params={"limit": 1000}).json())

        t = threading.Thread(target=stream, daemon=True)
        t.start()
        try:
            wait_until = time.monotonic() + 30
            while decided() < 4 and time.monotonic() < wait_until:  # evaluation under way
                time.sleep(0.01)
            before = decided()
            # what one evaluation costs now, on this machine, under this very load (the stream runs)
            cost = evaluation_cost_s(heaviest_constant_constraint())
            latencies = []
            with httpx.Client(base_url=agent.url, timeout=30) as h:
                for _ in range(300):
                    t0 = time.perf_counter()
                    assert h.get("/health").status_code == 200
                    latencies.append(time.perf_counter() - t0)
            after = decided()
        finally:
            stop.set()
            t.join(30)
    latencies.sort()
    p99 = latencies[int(0.99 * len(latencies)) - 1]
    print(
        f"/health over {len(latencies)} requests: p50 {statistics.median(latencies) * 1e3:.1f} ms, "
        f"p99 {p99 * 1e3:.1f} ms, max {latencies[-1] * 1e3:.1f} ms; decisions during it: {after - before}; "
        f"one evaluation {cost * 1e3:.0f} ms"
    )
    # the constraints were being evaluated all along: decisions kept coming in while /health answered
    assert after - before >= 8, (before, after)
    # on the event loop, a /health arriving during an event would wait for the rest of its four
    # evaluations; the bound is half of one event's evaluation as measured during the run (a fixed
    # 100 ms failed at load 6 with the evaluation off the loop), and at least 100 ms
    bound = max(0.100, 2 * cost)
    assert p99 < bound, f"p99 {p99 * 1e3:.1f} ms, bound {bound * 1e3:.0f} ms"
