"""JSON has no NaN or infinity: the agent refuses them where they enter (422 / a clear error) and an
actuator returning one fails with a message, so no read or call of the agent can become a 500."""

from __future__ import annotations

import math
from typing import Any

import pytest
from agent_support import running

from scanflow.agent import Agent, Context, Outcome, Store
from scanflow.agent.jsonsafe import NotJSONError, non_finite_path, to_json_value


def test_non_finite_path_names_where_the_value_is() -> None:
    assert non_finite_path({"a": [1.0, {"b": math.inf}]}) == "$.a[1].b"
    assert non_finite_path({"a": [1.0, {"b": 2}], "c": "nan"}) is None
    with pytest.raises(NotJSONError, match=r"\$\.x"):
        to_json_value({"x": math.nan})


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
async def test_post_event_with_a_non_finite_number_is_a_422_and_events_stay_readable(
    store: Store, literal: str
) -> None:
    async with running(Agent("a"), store) as c:
        body = '{"name": "latency.breached", "payload": {"latency_ms": ' + literal + '}}'
        r = await c.post("/events", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 422, r.text
        assert "non-finite" in r.text and "latency_ms" in r.text
        assert (await c.get("/events")).status_code == 200
        assert store.count_events() == 0


def test_store_refuses_a_non_finite_payload(store: Store) -> None:
    with pytest.raises(ValueError, match="non-finite"):
        store.add_event("x", {"v": [math.nan]})
    assert store.count_events() == 0


def _agent() -> Agent:
    a = Agent("exec", role="executor")

    @a.actuator("evaluate")
    def evaluate(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
        return {"champion_accuracy": math.nan, "promoted": False}  # e.g. no champion to compare with

    @a.actuator("outcome")
    def outcome(ctx: Context, args: dict[str, Any]) -> Outcome:
        return Outcome.ok({"x": math.inf})

    @a.actuator("fine")
    def fine(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
        return {"x": 1.5, "when": ctx}  # a non-JSON object becomes a string, as before

    return a


@pytest.mark.parametrize("name", ["evaluate", "outcome"])
async def test_an_actuator_returning_nan_fails_with_a_message_not_a_500(store: Store, name: str) -> None:
    async with running(_agent(), store) as c:
        r = await c.post(f"/actuators/{name}", json={"idempotency_key": "k1"})
        assert r.status_code == 422, r.text
        assert r.json()["status"] == "failed" and "non-finite" in r.json()["detail"]
        again = await c.post(f"/actuators/{name}", json={"idempotency_key": "k1"})
        assert again.status_code == 422 and again.json()["duplicate"] is True
        r = await c.post("/actuators/fine", json={})
        assert r.status_code == 200 and r.json()["result"]["x"] == 1.5
        assert isinstance(r.json()["result"]["when"], str)


def test_a_recorded_outcome_hides_secret_keys_and_bounds_its_size() -> None:
    from scanflow.agent.outcomes import HIDDEN, RESULT_BYTES, recorded_outcome
    from scanflow.agent.types import Outcome

    got = recorded_outcome(Outcome.ok({"version": "3", "run": {"id": "r1", "api_token": "s3cr3t"},
                                       "steps": [{"db_password": "x", "ok": True}]}))
    assert got == {"status": "ok", "error": None,
                   "result": {"version": "3", "run": {"id": "r1", "api_token": HIDDEN},
                              "steps": [{"db_password": HIDDEN, "ok": True}]}}
    big = recorded_outcome(Outcome.ok({"rows": list(range(RESULT_BYTES)), "n": 1}))
    assert big["result"]["truncated"] is True and big["result"]["keys"] == ["n", "rows"]
    assert big["result"]["bytes"] > RESULT_BYTES
    failed = recorded_outcome(Outcome.failed("boom"))
    assert failed == {"status": "failed", "error": "boom", "result": {}}
