"""The typed messages between the standard agents (scanflow.messages): what a sender builds is what the
receiver takes, every event the standard workflow sends to a peer has a model, and the reference Planner
and Executor refuse a malformed event at their door with a 422 naming the field."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agents_support import digits_workflow
from fastapi.testclient import TestClient

from scanflow import messages
from scanflow.agentkit.latency import Percentile

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "t" * 32


def test_every_event_the_standard_agents_send_a_peer_has_a_model() -> None:
    from scanflow.standard import standard_agents

    specs = {a.name: a for a in standard_agents("digits")}
    forwarded = {(s.event, a.args.get("agent")) for spec in specs.values() for s in spec.strategies
                 for a in s.actions if a.actuator == "forward"}
    assert forwarded and all(to == "planner" for _, to in forwarded)
    assert {e for e, _ in forwarded} <= set(messages.EVENTS)
    # the Executor runs a strategy per plan kind, and only for the kinds the Plan union knows
    kinds = {s.constraint.split("'")[1] for s in specs["executor"].strategies if s.event == "plan.approved"}
    assert kinds == set(messages.PLAN_KINDS)


def test_the_checkers_latency_payload_is_a_latency_checked() -> None:
    from scanflow.standard.checker import latency_event

    seen = messages.ServiceChecked(service="digits", replicas=2, healthy_replicas=2, in_flight=3).payload()
    obs = messages.Observations(arrival_rate=120.0, cpu_limit_cores=0.5, threads=1, node_cpus=2).payload()
    ev = latency_event(seen, Percentile(80.0, False), 50.0, 1, obs=obs, declared_cpu=0.5)
    assert ev is not None
    got = messages.parse("latency.checked", ev)
    assert got.breached and got.slo_ms == 50.0 and got.replicas == 2 and got.arrival_rate == 120.0


def test_the_planners_resources_plan_is_a_plan_the_executor_takes() -> None:
    from scanflow.policies import pinning
    from scanflow.spec import Service
    from scanflow.standard.planner import resources_plan

    svc = Service(name="digits", model_uri="models:/m@champion")
    on = pinning.PinConfig(mode="numa")
    plan = resources_plan(svc, 2.0, 2, pinning.decide(pinning.PinContext(2.0, 1, 8, on)), "grow", "k")
    got = messages.parse("plan.approved", plan)
    assert isinstance(got, messages.ResourcesPlan) and got.threads == 2 and got.affinity is not None


@pytest.mark.parametrize(("payload", "field"), [
    ({"plan": "scale", "service": "digits"}, "replicas"),
    ({"plan": "scale", "service": "digits", "replicas": "3"}, "replicas"),
    ({"plan": "scale", "service": "digits", "replicas": True}, "replicas"),
    ({"plan": "resources", "service": "digits", "resources": {"cpu": 1.0}, "threads": 0}, "threads"),
    ({"plan": "grow", "service": "digits"}, "plan"),
])
def test_a_malformed_plan_names_its_field(payload: dict[str, Any], field: str) -> None:
    with pytest.raises(messages.MessageError, match=field):
        messages.parse("plan.approved", payload)


def test_fields_a_newer_sender_adds_are_ignored() -> None:
    got = messages.parse("drift.checked", {"drift": True, "added_in_a_later_version": 1})
    assert got.drift and not hasattr(got, "added_in_a_later_version")


@pytest.fixture(scope="module")
def planner_and_executor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, TestClient]]:
    """The reference Planner and Executor apps, loaded from scanflow/standard/*.py, without the hooks that need the
    rest of a stack (MLflow, the platform): their door, POST /events, is what is under test."""
    from contextlib import ExitStack

    from scanflow.agent import Store, create_app
    from scanflow.settings import Settings
    from scanflow.spec import load_python_file

    home = tmp_path_factory.mktemp("agents")
    mp = pytest.MonkeyPatch()
    mp.setenv("SCANFLOW_TOKEN", TOKEN)
    mp.delenv("SCANFLOW_AUTH_TOKENS", raising=False)
    clients: dict[str, TestClient] = {}
    with ExitStack() as stack:
        stack.callback(mp.undo)
        for role in ("planner", "executor"):
            agent = load_python_file(ROOT / "scanflow" / "standard" / f"{role}.py").agent.bound(digits_workflow())
            agent.sensors.clear()
            agent.startup_hooks.clear()
            agent.shutdown_hooks.clear()
            (home / role).mkdir()
            store = Store(f"sqlite:///{home / role / 'agent.db'}")
            stack.callback(store.close)
            app = create_app(agent, Settings(token=TOKEN, home=home / role), store=store)
            client = stack.enter_context(TestClient(app))
            client.headers["Authorization"] = f"Bearer {TOKEN}"
            clients[role] = client
        yield clients


@pytest.mark.parametrize(("role", "name", "payload", "loc"), [
    ("planner", "drift.checked", {"drift": "yes"}, ["body", "payload", "drift"]),
    ("planner", "latency.checked", {"service": "digits", "latency_ms": 80.0}, ["body", "payload", "slo_ms"]),
    ("planner", "service.checked", {"service": "digits", "replicas": -1}, ["body", "payload", "replicas"]),
    ("planner", "plan.approved", {"plan": "scale", "service": "digits", "replicas": 2}, ["body", "name"]),
    ("executor", "plan.approved", {"plan": "scale", "service": "digits", "replicas": 1.5},
     ["body", "payload", "scale", "replicas"]),
    ("executor", "drift.checked", {"drift": True}, ["body", "name"]),
    # the Executor's own start-up event: no one outside may ask it to roll an image
    ("executor", "image.outdated", {"service": "digits", "running": "a", "configured": "b"}, ["body", "name"]),
])
def test_a_malformed_or_unknown_event_is_a_422_naming_the_field(
        planner_and_executor: dict[str, TestClient], role: str, name: str, payload: dict[str, Any],
        loc: list[str]) -> None:
    c = planner_and_executor[role]
    r = c.post("/events", json={"name": name, "payload": payload})
    assert r.status_code == 422, r.text
    assert loc in [e["loc"] for e in r.json()["detail"]], r.text
    stored = [e for e in c.get("/events").json() if e["name"] == name and e["payload"] == payload]
    assert stored == []  # refused at the door: nothing stored


def test_the_typed_models_are_in_each_receivers_openapi(planner_and_executor: dict[str, TestClient]) -> None:
    for role, models in (("planner", {"DriftChecked", "LatencyChecked", "ServiceChecked"}),
                         ("executor", {"ScalePlan", "ResourcesPlan", "RoutePlan", "RetrainPlan"})):
        doc = planner_and_executor[role].get("/openapi.json").json()
        assert models <= set(doc["components"]["schemas"]), role
        body = doc["paths"]["/events"]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body["oneOf"], role


def test_a_well_formed_event_is_taken(planner_and_executor: dict[str, TestClient]) -> None:
    r = planner_and_executor["executor"].post("/events", json={
        "name": "plan.approved", "payload": {"plan": "route", "service": "digits", "to": None},
        "idempotency_key": "typed-route-1"})
    assert r.status_code == 202, r.text
