"""Reliability: S1 while agents are SIGKILLed at random moments (at least 5 times) and restarted.

The loop must still complete, and the durable stores must show no action done twice: one succeeded
outcome per idempotency key (a key is a row) and, per logical action, one retrain, one promotion.
"""

from __future__ import annotations

import random
import threading
import time

import pytest
from e2e_support import digits_workflow
from scenario import run_s1

from scanflow.agent import Store
from scanflow.stack import EmbeddedStack, Traffic

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]
ROLES = ("tracker", "checker", "planner", "executor")


class Chaos:
    """From the drift onset on: `kills` times, wait 2-8 s (random), SIGKILL a random agent, restart it.

    Bounded on purpose: the loop must complete through the kills, not outrun an endless stream of them
    (every Executor restart restarts a running training job; the services it adopts keep serving).
    """

    def __init__(self, stack: EmbeddedStack, seed: int = 1, kills: int = 6) -> None:
        self.stack, self.rng, self.n = stack, random.Random(seed), kills
        self.kills: list[tuple[float, str]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while len(self.kills) < self.n and not self.stop.wait(self.rng.uniform(2.0, 8.0)):
            role = self.rng.choice(ROLES)
            self.stack.kill_agent(role)
            self.kills.append((time.time(), role))
            self.stack.restart_agent(role)


def failures_by_last_kill(kills: list[tuple[float, str]], failed_at: list[float]) -> dict[str, int]:
    """Pure: each failed request charged to the agent killed last before it ('none' before any kill)."""
    out: dict[str, int] = {}
    for t in failed_at:
        before = [r for k, r in kills if k <= t]
        role = before[-1] if before else "none"
        out[role] = out.get(role, 0) + 1
    return out


def _actions(stack: EmbeddedStack, role: str) -> list:
    store = Store(f"sqlite:///{stack.agent_home(role) / (role + '.db')}")
    try:
        return store.list_actions(limit=100000)
    finally:
        store.close()


def test_s1_survives_random_agent_kills(tmp_path, pools) -> None:  # type: ignore[no-untyped-def]
    with EmbeddedStack(tmp_path / "stack", digits_workflow(), quick=True) as stack:
        chaos = Chaos(stack)
        with Traffic(stack.service_url, pools["clean"], pools["drifted"], rate=40, clients=2,
                     tracker_url=stack.agent_urls["tracker"], token=stack.token) as traffic:
            try:
                res = run_s1(stack, traffic, timeout_s=300, on_onset=chaos.thread.start)
                deadline = time.time() + 60
                while len(chaos.kills) < 5 and time.time() < deadline:
                    time.sleep(0.5)
            finally:
                chaos.stop.set()
                if chaos.thread.ident is not None:  # started at the drift onset
                    chaos.thread.join(timeout=120)
        acts = {r: _actions(stack, r) for r in ROLES}

    assert len(chaos.kills) >= 5, chaos.kills
    assert res.new_version != res.old_version
    for role, rows in acts.items():  # one row per key, so a key can never have two successes
        assert len({a.key for a in rows}) == len(rows), role
    done = [a for a in acts["executor"] if a.status == "succeeded"]
    assert sum(a.actuator == "retrain" for a in done) == 1, [(a.key, a.actuator) for a in done]
    assert sum(a.actuator == "evaluate_and_promote" for a in done) == 1
    plans = [a for a in acts["planner"] if a.status == "succeeded" and a.actuator == "submit_plan"
             and a.args.get("plan") == "retrain"]
    assert len(plans) == 1
    moves = [p for p in res.promotions if p["actor"] == "executor"]
    assert len(moves) == 1 and moves[0]["version"] == res.new_version
    failed = traffic.failed()
    print(f"reliability: kills {[r for _, r in chaos.kills]}; S1 in {res.served_at - res.onset:.1f}s; "
          f"{traffic.count()} requests, {len(failed)} failed, by the agent killed last before them: "
          f"{failures_by_last_kill(chaos.kills, [a.t for a in failed])}")
    # a restarted Executor adopts the running services (LocalPlatform.adopt): the kills cost no request
    # (measured 0 of 4,553 with 3 Executor kills; 1,263-1,762 when every restart redeployed them)
    assert failed == [], failures_by_last_kill(chaos.kills, [a.t for a in failed])


# ---- issue #15: nothing served is lost when two things fail ------------------------------------------


def _served_ok(req, out):  # type: ignore[no-untyped-def]
    """(wall time, status, the record id the answer returned; None when there was no 200)."""
    if out.response is None:
        return (out.t_wall, 0, f"{type(out.error).__name__}: {out.error}")
    if out.response.status_code != 200:
        return (out.t_wall, out.response.status_code, out.response.text[:200])
    return (out.t_wall, 200, out.response.json()["request_id"])


def _stored_ids(stack: EmbeddedStack) -> dict[str, int]:
    """request_id -> how many rows the Tracker's durable prediction store holds for it."""
    import sqlite3

    name = (stack.agent_spec("tracker").name if stack.agent_spec("tracker") else "tracker")
    db = stack.agent_home("tracker") / f"{name}-predictions.db"
    with sqlite3.connect(db) as conn:
        return dict(conn.execute("SELECT request_id, COUNT(*) FROM prediction_records GROUP BY request_id"))


def _kill_a_replica(stack: EmbeddedStack) -> int:
    import os
    import signal

    for rep in stack.get("executor", "/services")["digits"]["replicas"]:
        if rep.get("pid"):
            os.killpg(rep["pid"], signal.SIGKILL)
            return int(rep["pid"])
    raise AssertionError("no live replica of the primary to kill")


@pytest.mark.timeout(900)
def test_nothing_served_is_lost_through_tracker_replica_mlflow_and_agent_kills(tmp_path, pools) -> None:  # type: ignore[no-untyped-def]
    """20 clients for the whole run while: (a) the Tracker is killed, then a serving replica (records
    only in its spool meanwhile), then the Tracker comes back; (b) MLflow is SIGKILLed and the stack
    restarts it; (c) 20 SIGKILLs of random agents, each restarted. Then every prediction a client got a
    200 for is in the Tracker's store exactly once, by the id the answer returned, and no client saw an
    error."""
    import orjson

    from scanflow.loadgen import LoadGenerator, Request

    x = pools["clean"][0]
    rng = random.Random(15)

    def make(worker: int, n: int) -> Request:
        return Request(orjson.dumps({"inputs": [x[(worker * 7919 + n) % len(x)].tolist()]}))

    with EmbeddedStack(tmp_path / "stack", digits_workflow(), quick=True) as stack:
        kills: list[tuple[float, str]] = []
        with LoadGenerator(stack.service_url + "/predict", make, _served_ok, clients=20, rate=100.0,
                           timeout_s=30.0, name="reliability") as gen:
            began = time.time()
            time.sleep(5)
            stack.kill_agent("tracker")  # (a) records now wait in the replicas' spools ...
            kills.append((time.time(), "tracker"))
            time.sleep(5)
            kills.append((time.time(), f"replica pid {_kill_a_replica(stack)}"))  # ... and one of them dies
            time.sleep(10)
            stack.restart_agent("tracker")
            stack.kill_mlflow()  # (b) the stack's watch restarts it
            kills.append((time.time(), "mlflow"))
            for _ in range(20):  # (c)
                time.sleep(rng.uniform(0.5, 2.0))
                role = rng.choice(ROLES)
                if stack.alive(role):
                    stack.kill_agent(role)
                    kills.append((time.time(), role))
                stack.restart_agent(role, wait=False)
            time.sleep(max(5.0, 60.0 - (time.time() - began)))  # the load runs 60 s at least
        for role in ROLES:  # every agent back (a restart still starting is waited for)
            if not stack.alive(role):
                stack.restart_agent(role)
            stack._wait_healthy(role)
        answers = gen.results()
        served = [rid for _, status, rid in answers if status == 200]
        deadline = time.time() + 180  # the restarted replica's spool and the Tracker's backlog drain
        while time.time() < deadline and not set(served) <= set(_stored_ids(stack)):
            time.sleep(1)
        stored = _stored_ids(stack)
        restarts = stack.mlflow_restarts

    missing = [rid for rid in served if rid not in stored]
    errors = [(t, s, why) for t, s, why in answers if s != 200]
    print(f"reliability #15: {len(answers)} requests, {len(served)} served, {len(missing)} not stored, "
          f"{len(errors)} client errors, {len(kills)} kills, MLflow restarts {restarts}")
    assert len(served) == len(set(served)) > 1000
    assert not missing, f"{len(missing)} of {len(served)} served predictions were never logged"
    assert all(stored[rid] == 1 for rid in served)
    assert restarts >= 1
    assert errors == [], errors[:5]
