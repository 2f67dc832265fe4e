"""Reliability: S1 while agents are SIGKILLed at random moments (at least 5 times) and restarted.

The loop must still complete, and the durable stores must show no action done twice: one succeeded
outcome per idempotency key (a key is a row) and, per logical action, one retrain, one promotion.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
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

RATE = 100.0  # scheduled arrivals per second (open loop)
CLIENTS = 20
MIN_LOAD_S = 60.0
# arrivals due while all 20 clients were busy: a stall of more than 0.2 s of the service or of this
# process (the generator shares its GIL with the checks) leaves some unsent. Measured: 0 here, quiet
# and beside 3 busy loops; 21 of 7,060 (0.3 %) in one CI run; 136 of 9,496 in another, all in one
# second, during the first phase's check (this process reading MLflow's batches), with the service's
# p99 at 30 ms. The bound says the load ran, not the loss: every request sent must still be answered
# and stored exactly once. So it allows 1 % of the load or one stall of two seconds, whichever is more;
# the achieved rate is bounded too (RATE_MIN_FRACTION).
UNSENT_MAX_FRACTION = 0.01
UNSENT_MAX_STALL_S = 2.0
RATE_MIN_FRACTION = 0.98  # of the scheduled rate, sent over the whole load
AGENT_KILLS = 20
CATCH_UP_S = 180.0  # for a phase's served predictions to reach the store and MLflow (spools, backlog)


def _served_ok(req, out):  # type: ignore[no-untyped-def]
    """(wall time, status, the record id the answer returned; None when there was no 200)."""
    if out.response is None:
        return (out.t_wall, 0, f"{type(out.error).__name__}: {out.error}")
    if out.response.status_code != 200:
        return (out.t_wall, out.response.status_code, out.response.text[:200])
    return (out.t_wall, 200, out.response.json()["request_id"])


def _tracker_db(stack: EmbeddedStack) -> Path:
    spec = stack.agent_spec("tracker")
    return stack.agent_home("tracker") / f"{spec.name if spec else 'tracker'}-predictions.db"


def _stored_ids(stack: EmbeddedStack) -> dict[str, int]:
    """request_id -> how many rows the Tracker's durable prediction store holds for it."""
    with sqlite3.connect(_tracker_db(stack)) as conn:
        return dict(conn.execute("SELECT request_id, COUNT(*) FROM prediction_records GROUP BY request_id"))


def _mlflow_ids(stack: EmbeddedStack) -> Counter[str]:
    """request_id -> how many times it appears across every Parquet batch the Tracker flushed to its
    predictions run in MLflow (all files, both layouts, no de-duplication: what MLflow really holds)."""
    import pyarrow.parquet as pq

    from scanflow.tracking.predictions import all_batch_artifacts, mlflow_lister, run_artifact_repo

    with sqlite3.connect(_tracker_db(stack)) as conn:
        row = conn.execute("SELECT run_id FROM prediction_flush_state").fetchone()
    counts: Counter[str] = Counter()
    if row is None or row[0] is None:
        return counts
    repo = run_artifact_repo(row[0])
    with tempfile.TemporaryDirectory(prefix="reliability-") as tmp:
        for path in all_batch_artifacts(mlflow_lister(row[0], repo)):
            local = repo.download_artifacts(path, tmp)
            counts.update(pq.read_table(local, columns=["request_id"]).column("request_id").to_pylist())
            os.unlink(local)
    return counts


@contextmanager
def _restored_uri(previous: str | None) -> Iterator[None]:
    """MLflow's process-wide tracking URI (and MLFLOW_TRACKING_URI) back to `previous` afterwards."""
    import mlflow

    try:
        yield
    finally:
        mlflow.set_tracking_uri(previous)  # type: ignore[arg-type]  # None unsets
        if previous is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = previous


def _kill_a_replica(stack: EmbeddedStack) -> tuple[int, int]:
    """SIGKILL the live replica of the primary that owes the Tracker the most records (undelivered, read
    from its /info just before, with its spool holding bytes): (pid, records owed). Without owed records
    the phase would prove nothing."""
    owing = []
    for rep in stack.get("executor", "/services")["digits"]["replicas"]:
        if rep.get("pid") and rep.get("address"):
            info = httpx.get(rep["address"] + "/info", timeout=10.0).json()
            if (info.get("spool") or {}).get("bytes"):
                owing.append((int(info.get("tracker_pending") or 0), int(rep["pid"])))
    owed, pid = max(owing, default=(0, 0))
    assert owed > 0, f"no live replica of the primary owes spooled records to the down Tracker: {owing}"
    os.killpg(pid, signal.SIGKILL)
    return pid, owed


def _check_phase(phase: str, stack: EmbeddedStack, gen, named: dict[str, int]) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """Every prediction a client got a 200 for so far is in the Tracker's store and in MLflow's batches
    exactly once, by the id its answer returned (waiting up to CATCH_UP_S for them to arrive, while the
    load goes on), no id is in MLflow twice, and no client saw an error. Returns the phase's counts."""
    answers = gen.results()
    served = [rid for _, status, rid in answers if status == 200]
    errors = [(t, status, why) for t, status, why in answers if status != 200]
    assert len(served) == len(set(served)), f"{phase}: an id was answered twice"
    wanted = set(served)
    deadline = time.monotonic() + CATCH_UP_S
    stored: dict[str, int] = {}
    in_mlflow: Counter[str] = Counter()
    while True:
        stored = _stored_ids(stack)
        if wanted <= stored.keys():
            in_mlflow = _mlflow_ids(stack)
            if wanted <= in_mlflow.keys():
                break
        if time.monotonic() > deadline:
            break
        time.sleep(1.0)
    not_stored = wanted - stored.keys()
    not_in_mlflow = wanted - in_mlflow.keys()
    twice = {rid: n for rid, n in in_mlflow.items() if n != 1}
    counts = {"requests": len(answers), "served": len(served), "errors": len(errors), "in_mlflow": len(in_mlflow),
              **named}
    print(f"reliability #15, after {phase}: {counts}")
    assert not not_stored, f"{phase}: {len(not_stored)} of {len(served)} served predictions never reached the store"
    assert all(stored[rid] == 1 for rid in wanted)
    assert not not_in_mlflow, f"{phase}: {len(not_in_mlflow)} of {len(served)} served predictions not in MLflow"
    assert not twice, f"{phase}: {len(twice)} ids flushed to MLflow more than once, e.g. {list(twice.items())[:5]}"
    assert errors == [], f"{phase}: {len(errors)} client errors, e.g. {errors[:5]}"
    return counts


@pytest.mark.timeout(1200)
def test_nothing_served_is_lost_through_tracker_replica_mlflow_and_agent_kills(tmp_path, pools) -> None:  # type: ignore[no-untyped-def]
    """20 clients, open loop at 100 requests/s, through one session of three phases, each ending with a
    check (_check_phase: every prediction served so far stored and flushed to MLflow exactly once, no
    client error): (a) the Tracker is killed, then a serving replica (its records only in its spool
    meanwhile), then the Tracker comes back; (b) MLflow is SIGKILLed and the stack restarts it (a new
    process, counted by the stack's watch); (c) 20 SIGKILLs of random agents, each restarted. The load
    must really run: at least 60 s, nearly every scheduled arrival sent (`unsent` bounded) and the
    achieved rate close to the scheduled one."""
    import mlflow
    import orjson

    from scanflow.loadgen import LoadGenerator
    from scanflow.loadgen_http import Request
    from scanflow.tracking.server import is_healthy

    x = pools["clean"][0]
    rng = random.Random(15)

    def make(worker: int, n: int) -> Request:
        return Request(orjson.dumps({"inputs": [x[(worker * 7919 + n) % len(x)].tolist()]}))

    previous_uri = os.environ.get("MLFLOW_TRACKING_URI")
    with EmbeddedStack(tmp_path / "stack", digits_workflow(), quick=True) as stack, _restored_uri(previous_uri):
        mlflow.set_tracking_uri(stack.tracking_uri)  # the check reads the batches as the operator
        agent_kills: list[str] = []
        with LoadGenerator(stack.service_url + "/predict", make, _served_ok, clients=CLIENTS, rate=RATE,
                           timeout_s=30.0, name="reliability") as gen:
            began = time.monotonic()
            # (a) records wait in the replicas' spools while the Tracker is down ... and one replica dies
            time.sleep(5)
            stack.kill_agent("tracker")
            time.sleep(5)
            with pytest.raises(httpx.TransportError):  # really down: the records wait in the spools
                httpx.get(stack.agent_urls["tracker"] + "/health", timeout=2.0)
            replica, owed = _kill_a_replica(stack)
            time.sleep(10)
            stack.restart_agent("tracker")
            _check_phase("(a) Tracker and replica killed", stack, gen,
                         {"replica_killed": replica, "records_owed": owed})

            # (b) MLflow SIGKILLed: the stack's watch must start a new one
            restarts, old_pid = stack.mlflow_restarts, stack.mlflow.pid
            stack.kill_mlflow()
            deadline = time.monotonic() + 120
            while stack.mlflow_restarts == restarts and time.monotonic() < deadline:
                time.sleep(0.5)
            assert stack.mlflow_restarts == restarts + 1, "the stack did not restart MLflow"
            assert stack.mlflow.pid not in (None, old_pid) and is_healthy(stack.tracking_uri)
            _check_phase("(b) MLflow killed and restarted", stack, gen, {"mlflow_restarts": stack.mlflow_restarts})

            # (c) 20 SIGKILLs of random agents, each restarted without waiting (a kill may land on one still starting)
            while len(agent_kills) < AGENT_KILLS:
                time.sleep(rng.uniform(0.5, 2.0))
                role = rng.choice(ROLES)
                if stack.alive(role):
                    stack.kill_agent(role)
                    agent_kills.append(role)
                stack.restart_agent(role, wait=False)
            time.sleep(max(5.0, MIN_LOAD_S - (time.monotonic() - began)))
        load_s = time.monotonic() - began
        for role in ROLES:  # every agent back (a restart still starting is waited for)
            if not stack.alive(role):
                stack.restart_agent(role)
            stack._wait_healthy(role)
        final = _check_phase("(c) 20 agent kills", stack, gen, {"agent_kills": len(agent_kills)})
        sent, unsent = gen.sent, gen.unsent
        behind = [(round(s.t - began), s.unsent, s.in_flight, s.p99_ms) for s in gen.seconds(began) if s.unsent]

    scheduled = RATE * load_s
    print(f"reliability #15: load {load_s:.0f} s, {sent} sent of {scheduled:.0f} scheduled "
          f"({sent / load_s:.1f}/s), {unsent} unsent, agent kills {agent_kills}, final {final}; "
          f"seconds with unsent arrivals (s into the load, unsent, in flight, p99 ms): {behind}")
    assert len(agent_kills) == AGENT_KILLS
    assert load_s >= MIN_LOAD_S
    assert unsent <= max(UNSENT_MAX_FRACTION * scheduled, UNSENT_MAX_STALL_S * RATE), (
        f"{unsent} of {scheduled:.0f} arrivals were never sent; the seconds they were due in: {behind}")
    assert sent >= RATE_MIN_FRACTION * scheduled, f"{sent / load_s:.1f} requests/s sent, {RATE:g} scheduled"
    assert final["requests"] == sent  # every request sent was answered (and with a 200: no errors above)
