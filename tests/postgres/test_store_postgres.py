"""The agents' durable store on a real PostgreSQL server (the prod overlay's and compose's store).

Agents run as real processes (`scanflow agent run tests/agent/sample_agents.py`): SIGKILL at random
points loses no event and repeats no finished action, and a second agent on the same database (two
Executors during a rollout) is refused while the first lives, and takes over once it is gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from scanflow.agent import Store
from scanflow.agent.store_owner import StoreBusyError
from scanflow.platform.processes import free_port

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "tests" / "agent" / "sample_agents.py"
TOKEN = "pg-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
START_S = 60.0  # an agent process imports FastAPI + SQLAlchemy: seconds on a loaded 2-core box


def wait_until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class Proc:
    def __init__(self, name: str, url: str, out: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "SCANFLOW_STORE_URL": url, "SCANFLOW_TOKEN": TOKEN, "SCANFLOW_TEST_OUT": str(out),
               "SCANFLOW_HOME": str(out / "home"), "PYTHONPATH": os.pathsep.join(filter(None, [
                   str(ROOT), os.environ.get("PYTHONPATH")]))}
        env.pop("SCANFLOW_PEERS", None)
        self.log = open(out / f"{name}-{self.port}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "scanflow.cli", "agent", "run", str(SAMPLES), "--name", name,
             "--port", str(self.port)], env=env, stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT,
            start_new_session=True)

    def up(self) -> bool:
        try:
            return httpx.get(self.url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self.log.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.kill()


def test_store_claim_is_exclusive_per_database(pg_database: str) -> None:
    first, second = Store(pg_database), Store(pg_database)
    try:
        first.claim()
        with pytest.raises(StoreBusyError, match="another running agent"):
            second.claim()
        first.release()
        second.claim()  # the lock is gone with its owner
    finally:
        first.close()
        second.close()


def test_sigkill_loses_no_event_and_repeats_no_finished_action(pg_database: str, tmp_path: Path) -> None:
    import random

    rng = random.Random(14)
    n_events, kills = 40, 0
    kill_at = sorted(rng.sample(range(5, n_events), 3))
    worker = Proc("worker", pg_database, tmp_path)
    accepted: list[int] = []
    try:
        wait_until(worker.up, START_S, "the worker")
        for i in range(n_events):
            r = httpx.post(worker.url + "/events", json={"name": "tick", "payload": {"i": i},
                                                          "idempotency_key": f"tick-{i}"}, headers=AUTH, timeout=10)
            assert r.status_code == 202, r.text
            accepted.append(i)
            if kill_at and i == kill_at[0]:
                kill_at.pop(0)
                worker.kill()  # SIGKILL: the PostgreSQL session dies with it, and so does its owner lock
                kills += 1
                worker = Proc("worker", pg_database, tmp_path)
                wait_until(worker.up, START_S, "the restarted worker")

        def drained() -> bool:
            return httpx.get(worker.url + "/events", params={"status": "pending"}, headers=AUTH,
                             timeout=10).json() == []

        wait_until(drained, 120, "the worker's inbox to drain")
    finally:
        worker.stop()
    assert kills == 3
    store = Store(pg_database)
    try:
        done = store.list_events(status="done", limit=1000)
        assert len(done) == n_events  # every accepted event reached the end, none lost with a process
    finally:
        store.close()
    effects = (tmp_path / "effects.log").read_text().split()
    assert len(effects) == len(set(effects)) == 2 * n_events  # each action applied once, two per tick


def test_two_agents_started_at_once_never_both_run(pg_database: str, tmp_path: Path) -> None:
    a, b = Proc("executor", pg_database, tmp_path), Proc("executor", pg_database, tmp_path)
    try:
        # exactly one comes up; the other exits refusing the store
        wait_until(lambda: (a.up() or b.up()) and (a.proc.poll() is not None or b.proc.poll() is not None),
                   START_S, "one executor up and the other refused")
        live, refused = (a, b) if a.up() else (b, a)
        assert refused.proc.wait(10) != 0
        refused.log.close()
        assert "owns the store" in Path(refused.log.name).read_text()
        live.kill()  # a crash, not a clean stop
        again = Proc("executor", pg_database, tmp_path)
        try:
            wait_until(again.up, START_S, "a new executor once the old one is gone")
        finally:
            again.stop()
    finally:
        a.stop()
        b.stop()


def _terminate_owner(pg_database: str) -> int:
    """Drop the session holding the store's owner lock, as a server restart or a proxy's idle timeout
    would (pg_terminate_backend from an admin session); returns how many sessions were dropped."""
    import sqlalchemy as sa

    from scanflow.agent.store_owner import PG_OWNER_LOCK

    admin = sa.create_engine(pg_database, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            return int(conn.execute(sa.text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                "AND ((classid::bigint << 32) | objid::bigint) = :k AND pid <> pg_backend_pid()"),
                {"k": PG_OWNER_LOCK}).scalar())
    finally:
        admin.dispose()


def test_a_dropped_owner_session_is_taken_again_or_the_store_is_lost(pg_database: str) -> None:
    """The claim lives in one session. When it drops, the server frees the lock: `verify_claim` takes it
    again while nobody else has, and says the store is lost when another process took it in the gap."""
    first, second = Store(pg_database), Store(pg_database)
    try:
        first.claim()
        assert first.claims_by_session and first.verify_claim() is True  # held: nothing to do
        assert _terminate_owner(pg_database) == 1
        assert first.verify_claim() is False  # the session had dropped; the lock was free: held again
        with pytest.raises(StoreBusyError):
            second.claim()  # ... so a second process is still refused
        assert first.verify_claim() is True
        assert _terminate_owner(pg_database) == 1
        second.claim()  # another process claims in the gap
        with pytest.raises(StoreBusyError, match="another running agent"):
            first.verify_claim()
    finally:
        first.close()
        second.close()
    sqlite = Store("sqlite://")
    try:
        sqlite.claim()
        assert not sqlite.claims_by_session and sqlite.verify_claim() is True  # an flock: no session to lose
    finally:
        sqlite.close()


def test_an_agent_that_lost_its_store_stops_acting_and_exits(pg_database: str, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A real agent process on PostgreSQL: its session is dropped and another process claims the store
    in the gap; within a check interval the agent says so and exits, instead of acting beside the new
    owner. (A dropped session with the lock still free is taken again: the agent keeps serving.)"""
    monkeypatch.setenv("SCANFLOW_CLAIM_CHECK_S", "0.5")
    worker = Proc("worker", pg_database, tmp_path)
    other = Store(pg_database)

    def take_over() -> bool:
        """Drop the worker's session and claim the store before the worker's next check (retried: the
        worker may win a round)."""
        _terminate_owner(pg_database)
        try:
            other.claim()
        except StoreBusyError:
            return False
        return True

    try:
        wait_until(worker.up, START_S, "the worker")
        log = Path(worker.log.name)
        assert _terminate_owner(pg_database) == 1
        wait_until(lambda: "is held again" in log.read_text(), 30, "the worker to take its lock again")
        assert worker.up()
        wait_until(take_over, 30, "another process to claim the store in the gap")
        assert worker.proc.wait(30) is not None
        assert "lost its store to another process" in log.read_text()
        assert other.verify_claim() is True  # the new owner keeps it
    finally:
        worker.stop()
        other.close()


def test_stores_created_at_once_on_a_fresh_database_all_start(pg_database: str) -> None:
    """Two agents starting at once (a rollout), or Tracker replicas: each creates the tables it needs on a
    fresh database at the same moment. Checked-then-created table by table, the loser failed with a
    UniqueViolation on pg_type (a traceback, instead of the clear refusal or a start); under the schema
    lock (scanflow.sqlschema) every one of them starts. Threads here: their own connections, the same race."""
    import threading

    from scanflow.tracking.feedback import FeedbackLog
    from scanflow.tracking.predictions import PredictionLog

    barrier = threading.Barrier(6)
    errors: list[BaseException] = []
    made: list[object] = []

    def start(kind: int) -> None:
        barrier.wait()
        try:
            made.append((Store, PredictionLog, FeedbackLog)[kind % 3](pg_database))
        except BaseException as exc:  # noqa: BLE001 - collected: the assertion says which
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        assert not errors, errors
        assert len(made) == 6
    finally:
        for m in made:
            m.close()  # type: ignore[attr-defined]
