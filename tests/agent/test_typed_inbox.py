"""The typed inbox: an agent that declares the models of the events it takes refuses, at POST /events, a
payload that does not fit (422 naming the field) and an event it does not take, before anything is stored;
its OpenAPI document carries the models. In-process (real SQLite, real ASGI app, real loop)."""

from __future__ import annotations

from typing import Any

from agent_support import drained, running
from pydantic import BaseModel, ConfigDict, Field

from scanflow.agent import Action, Agent, Context, Store


class Observed(BaseModel):
    model_config = ConfigDict(strict=True)
    rate: float = Field(ge=0)
    source_replicas: int = 1


def make_agent(calls: list[dict[str, Any]], *, typed: bool = True) -> Agent:
    a = Agent("checker", role="checker", messages={"load.observed": Observed} if typed else None)

    @a.actuator("note")
    def note(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
        calls.append(dict(ctx.event.payload) if ctx.event else {})
        return {}

    a.strategy("note-load", event="load.*", actions=[Action("note")], cooldown_s=0)
    return a


async def test_a_payload_that_fits_is_taken_and_handled(store: Store) -> None:
    calls: list[dict[str, Any]] = []
    async with running(make_agent(calls), store) as c:
        r = await c.post("/events", json={"name": "load.observed", "payload": {"rate": 2.5}})
        assert r.status_code == 202, r.text
        await drained(c)
    assert calls == [{"rate": 2.5}]


async def test_a_malformed_payload_is_a_422_naming_the_field_and_nothing_is_stored(store: Store) -> None:
    calls: list[dict[str, Any]] = []
    async with running(make_agent(calls), store) as c:
        for payload, field in (({"rate": "fast"}, "rate"), ({}, "rate"), ({"rate": -1.0}, "rate"),
                               ({"rate": 1.0, "source_replicas": True}, "source_replicas")):
            r = await c.post("/events", json={"name": "load.observed", "payload": payload})
            assert r.status_code == 422, (payload, r.text)
            assert [e["loc"] for e in r.json()["detail"]] == [["body", "payload", field]], r.text
        assert (await c.get("/events")).json() == []
    assert calls == []


async def test_an_event_the_agent_does_not_take_is_a_422_naming_what_it_takes(store: Store) -> None:
    async with running(make_agent([]), store) as c:
        r = await c.post("/events", json={"name": "load.guessed", "payload": {"rate": 1.0}})
        assert r.status_code == 422
        (err,) = r.json()["detail"]
        assert err["loc"] == ["body", "name"] and "load.observed" in err["msg"] and "load.guessed" in err["msg"]


async def test_an_agent_without_declared_messages_keeps_an_untyped_inbox(store: Store) -> None:
    calls: list[dict[str, Any]] = []
    async with running(make_agent(calls, typed=False), store) as c:
        r = await c.post("/events", json={"name": "load.guessed", "payload": {"rate": "fast"}})
        assert r.status_code == 202
        await drained(c)
    assert calls == [{"rate": "fast"}]


async def test_the_openapi_document_describes_each_declared_event(store: Store) -> None:
    async with running(make_agent([]), store) as c:
        doc = (await c.get("/openapi.json")).json()
    assert doc["components"]["schemas"]["Observed"]["properties"]["rate"]["minimum"] == 0
    body = doc["paths"]["/events"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    (variant,) = body["oneOf"]
    assert variant["properties"]["name"]["const"] == "load.observed"
    assert variant["properties"]["payload"] == {"$ref": "#/components/schemas/Observed"}
    assert "idempotency_key" in variant["properties"] and variant["additionalProperties"] is False


def test_a_bad_event_name_in_messages_is_refused_at_declaration() -> None:
    import pytest

    from scanflow.agent import AgentDefinitionError

    with pytest.raises(AgentDefinitionError, match="event name"):
        Agent("checker", messages={"bad name!": Observed})
