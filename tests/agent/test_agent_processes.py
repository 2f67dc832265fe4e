"""Agents as real OS processes (`scanflow agent run`) on loopback: REST between peers, auth, SIGKILL."""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from agent_support import TOKEN, AgentProcess, free_port_for

from scanflow.agent import Store

pytestmark = pytest.mark.integration
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def wait_until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.mark.slow
def test_strategy_calls_a_peer_actuator_over_http_with_token(
    spawn: Callable[..., AgentProcess], tmp_path: Path
) -> None:
    env = {"SCANFLOW_TEST_OUT": str(tmp_path)}
    executor = spawn("executor", free_port_for(), env=env).start()
    planner = spawn("planner", free_port_for(), env=env, args=["--peer", f"executor={executor.url}"]).start()
    executor.wait_ready()
    planner.wait_ready()

    # no token -> 401; malformed -> 422; the executor refuses a caller without the token too
    ev = {"name": "latency.breached", "payload": {"p99_ms": 80.0}, "idempotency_key": "lat-1"}
    assert httpx.post(planner.url + "/events", json=ev, timeout=5).status_code == 401
    r = httpx.post(planner.url + "/events", json={"name": "x", "payload": "nope"}, headers=AUTH, timeout=5)
    assert r.status_code == 422 and "payload" in str(r.json()["detail"])
    assert httpx.post(executor.url + "/actuators/scale", json={"args": {}}, timeout=5).status_code == 401

    assert httpx.post(planner.url + "/events", json=ev, headers=AUTH, timeout=5).status_code == 202
    low = {"name": "latency.breached", "payload": {"p99_ms": 10.0}}
    assert httpx.post(planner.url + "/events", json=low, headers=AUTH, timeout=5).status_code == 202

    scale_log = tmp_path / "scale.log"
    wait_until(
        lambda: scale_log.exists() and scale_log.read_text().strip() != "", 20, "the executor's actuator"
    )

    def planner_drained() -> bool:
        return httpx.get(planner.url + "/events", params={"status": "pending"}, timeout=5).json() == []

    wait_until(planner_drained, 20, "the planner's inbox to drain")
    # called once, with the intent's key, and the planner's triggering event as the executor's ctx.event
    assert scale_log.read_text().split() == ["scale-on-latency:1:0", "3", "80.0"]
    decisions = httpx.get(planner.url + "/decisions", timeout=5).json()
    assert [(d["event_id"], d["reason"]) for d in decisions] == [(2, "false"), (1, "fired")]
    assert decisions[1]["outcomes"]["scale-on-latency:1:0"]["status"] == "ok"
    executed = httpx.get(executor.url + "/metrics", timeout=5).text
    assert 'scanflow_agent_action_outcomes_total{status="ok"} 1.0' in executed


@pytest.mark.slow
def test_sigkill_at_random_points_loses_no_event_and_repeats_no_action(
    spawn: Callable[..., AgentProcess], tmp_path: Path
) -> None:
    rng = random.Random(1234)
    env = {"SCANFLOW_TEST_OUT": str(tmp_path)}
    worker = spawn("worker", free_port_for(), env=env).start()
    worker.wait_ready()
    accepted: dict[str, int] = {}
    kills = 0
    n_events = 100
    kill_at = sorted(rng.sample(range(5, n_events), 5))
    with httpx.Client(base_url=worker.url, headers=AUTH, timeout=2.0) as client:
        for i in range(n_events):
            key = f"tick-{i}"
            while key not in accepted:  # the producer retries with the same key until it is accepted
                try:
                    r = client.post(
                        "/events", json={"name": "tick", "payload": {"i": i}, "idempotency_key": key}
                    )
                    if r.status_code == 202:
                        accepted[key] = r.json()["id"]
                except httpx.TransportError:
                    worker.wait_ready()
            if kill_at and i == kill_at[0]:
                kill_at.pop(0)
                time.sleep(rng.uniform(0.0, 0.15))  # land somewhere in the middle of processing
                worker.kill()
                kills += 1
                worker.start()
        worker.wait_ready()

        def drained() -> bool:
            try:
                return client.get("/events", params={"status": "pending"}).json() == []
            except httpx.TransportError:
                return False

        wait_until(drained, 60, "the worker's inbox to drain")
    worker.stop()
    assert kills >= 5

    store = Store(f"sqlite:///{tmp_path / 'worker.db'}")
    try:
        events = store.list_events(limit=1000)
        # every accepted event is in the store once and done
        assert sorted(e["idempotency_key"] for e in events) == sorted(accepted)
        assert {e["status"] for e in events} == {"done"}
        # decided exactly once per event (no re-decision after a restart)
        per_event = Counter(d["event_id"] for d in store.list_decisions(limit=10_000))
        assert set(per_event.values()) == {1} and len(per_event) == n_events
        # every action succeeded, once per key
        actions = store.list_actions(limit=10_000)
        assert len(actions) == 2 * n_events and {a.status for a in actions} == {"succeeded"}
    finally:
        store.close()
    effects = (tmp_path / "effects.log").read_text().split()
    assert len(effects) == len(set(effects)) == 2 * n_events  # each effect applied exactly once
    # an action runs again only when a kill caught it between running and recording success
    invocations = Counter((tmp_path / "invocations.log").read_text().split())
    repeated = [k for k, n in invocations.items() if n > 1]
    assert len(repeated) <= kills, repeated
