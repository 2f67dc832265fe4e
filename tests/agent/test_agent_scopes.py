"""Security: per-component tokens with scopes on an agent (issue #15, item 3).

A replica's token is refused by the Executor's actuators, sensors and strategies; a Planner's token
may call actuators but not add strategies; the operator's token (admin) may do everything. The agent's
real app in-process, its accepted tokens from SCANFLOW_AUTH_TOKENS (digests only)."""

from __future__ import annotations

from typing import Any

import pytest
from agent_support import running

from scanflow.agent import Agent, Context, Store
from scanflow.auth import AUTH_TOKENS_ENV, COMPONENT_SCOPES, TokenTable
from scanflow.settings import Settings

TOKENS = {name: f"tok-{name}-0123456789" for name in COMPONENT_SCOPES}


def executor() -> Agent:
    a = Agent("executor", role="executor")

    @a.actuator("swap_model")
    def swap_model(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
        return {"swapped": True}

    return a


def bearer(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[name]}"}


async def test_a_replica_token_is_refused_by_the_executor(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    table = TokenTable.of({n: (TOKENS[n], scopes) for n, scopes in COMPONENT_SCOPES.items()})
    monkeypatch.setenv(AUTH_TOKENS_ENV, table.to_json())
    strategy = {"name": "s", "event": "x", "constraint": "event.rate > 1", "actions": [{"actuator": "swap_model"}]}
    async with running(executor(), store, settings=Settings(token=TOKENS["executor"])) as c:
        for path, body in (("/actuators/swap_model", {"args": {}}), ("/sensors/none", None), ("/strategies", strategy)):
            r = await c.post(path, json=body, headers=bearer("replica"))
            assert r.status_code == 403, (path, r.text)
            assert "'replica'" in r.json()["detail"] and TOKENS["replica"] not in r.text
        r = await c.post("/events", json={"name": "x"}, headers=bearer("replica"))
        assert r.status_code == 403
        # the Planner may call the Executor's actuators and post events, not add strategies
        r = await c.post("/actuators/swap_model", json={"args": {}}, headers=bearer("planner"))
        assert r.status_code == 200 and r.json()["result"] == {"swapped": True}
        assert (await c.post("/events", json={"name": "x"}, headers=bearer("planner"))).status_code == 202
        assert (await c.post("/strategies", json=strategy, headers=bearer("planner"))).status_code == 403
        # the operator's token is admin; an unknown one (even the executor's own, unlisted) is 401
        assert (await c.post("/strategies", json=strategy, headers=bearer("operator"))).status_code == 201
        assert (await c.post("/events", json={"name": "x"}, headers={"Authorization": "Bearer nope"})).status_code == 401


async def test_the_legacy_single_token_is_an_all_scopes_admin(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(AUTH_TOKENS_ENV, raising=False)
    async with running(executor(), store, settings=Settings(token="one-token")) as c:
        auth = {"Authorization": "Bearer one-token"}
        assert (await c.post("/actuators/swap_model", json={"args": {}}, headers=auth)).status_code == 200
        assert (await c.post("/events", json={"name": "x"}, headers=auth)).status_code == 202
