"""The agent's durable store: events inbox, decisions, action outcomes, agent state, sensor watermarks.

Why: "nothing lost". An agent killed at any moment resumes where it was: accepted events stay
pending until every action they caused has finished; decisions are written in the same transaction
as the strategy states they changed (so a restart neither re-decides nor forgets a cooldown); each
action is keyed by its idempotency key, so one that succeeded is never run again.

SQLAlchemy 2 Core on any URL; SQLite (the default, one file per agent) runs in WAL mode with a busy
timeout, and writes from this process go through one lock (one writer). New events go through the
inbox writer thread (scanflow.agent.inbox: group commit, driver-level insert, WAL checkpoints off the
request path); `submit_event` returns its Future for async callers. Every other method is synchronous
and may block: async callers use `await asyncio.to_thread(store.method, ...)`. The tables, statements
and engine are scanflow.agent.store_schema; the one-agent-per-store claim is scanflow.agent.store_owner.
Who calls: scanflow.agent.runtime (the loop), scanflow.agent.app (REST reads), tests, benchmarks.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from scanflow.agent.engine import Decision, Intent, StrategyState
from scanflow.agent.inbox import Accepted, Checkpointer, Done, EventRow, InboxWriter
from scanflow.agent.jsonsafe import check_depth, check_finite
from scanflow.agent.store_owner import OwnerLock
from scanflow.agent.store_schema import (
    ACTION_ATTEMPTS,
    ACTION_BY_KEY,
    FINISH_ACTION,
    FINISH_EVENT,
    INSERT_ACTION,
    INSERT_DECISIONS,
    KV_INSERT,
    KV_UPDATE,
    PENDING,
    RESTART_ACTION,
    ActionRecord,
    ActionStatus,
    action_record,
    actions,
    decisions,
    event_from_row,
    events,
    kv,
    make_engine,
    metadata,
    wait_for_server,
)
from scanflow.agent.types import Event
from scanflow.sqlschema import create_tables

STATE_KEY = "agent_state"
STRATEGY_STATES_KEY = "strategy_states"
REST_STRATEGIES_KEY = "rest_strategies"
WATERMARK_PREFIX = "sensor_watermark:"


class Store:
    """The durable store of one agent. Thread-safe; writes are serialised by one lock."""

    def __init__(self, url: str) -> None:
        self.url = url
        if url in ("sqlite://", "sqlite:///:memory:"):
            # One shared in-memory database (tests): every connection must see the same data.
            self.engine = sa.create_engine(
                "sqlite://", connect_args={"check_same_thread": False}, poolclass=sa.pool.StaticPool
            )
        else:
            self.engine = make_engine(url)
        path = self._file()
        if path is not None:
            # a fresh volume (an emptyDir mounted at /tmp while SCANFLOW_STORE_URL points at
            # /tmp/scanflow/<agent>.db) has no directory yet: SQLite cannot create it, and the agent
            # would crash-loop on "unable to open database file"
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        else:
            wait_for_server(self.engine)  # a server starting beside this agent (store_schema.SERVER_WAIT_S)
        self._write = threading.Lock()
        self._owner = OwnerLock(self.engine, path)
        create_tables(metadata, self.engine)
        self._writer: InboxWriter | None = None
        self._writer_init = threading.Lock()
        self._closed = False
        self._checkpointer: Checkpointer | None = None
        path = self._file()
        if path is not None:  # file-backed SQLite: checkpoints leave the commit path
            self._checkpointer = cp = Checkpointer(path)
            sa.event.listen(self.engine, "commit", lambda _conn: cp.committed())
            weakref.finalize(self, cp.close)  # a store never closed still stops its thread

    def close(self) -> None:
        with self._writer_init:
            self._closed = True
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._checkpointer is not None:
            self._checkpointer.close()
            self._checkpointer = None
        self.release()
        self.engine.dispose()

    def _inbox(self) -> InboxWriter:
        if self._writer is None:
            with self._writer_init:
                if self._closed:
                    raise RuntimeError("the store is closed")
                if self._writer is None:
                    cp = self._checkpointer
                    writer = InboxWriter(
                        self.engine, events, self._write, self._file(), cp.committed if cp else None
                    )
                    weakref.finalize(self, writer.close)
                    self._writer = writer
        return self._writer

    def _file(self) -> str | None:
        db = self.engine.url.database if self.engine.url.get_backend_name() == "sqlite" else None
        return db if db and db != ":memory:" else None

    # -- the owner lock (scanflow.agent.store_owner) --------------------------------------------
    def claim(self) -> None:
        """Become the only running agent on this store (`OwnerLock.claim`); StoreBusyError when
        another running process owns it."""
        self._owner.claim()

    @property
    def claims_by_session(self) -> bool:
        """True when this store's claim lives in a database session (PostgreSQL), which can drop while
        the process runs on: `verify_claim` should then be called now and then."""
        return self._owner.claims_by_session

    def verify_claim(self) -> bool:
        """Whether this process still holds the store's owner lock (`OwnerLock.verify_claim`)."""
        return self._owner.verify_claim()

    def release(self) -> None:
        self._owner.release()

    # -- events inbox ---------------------------------------------------------------------------
    def add_event(
        self,
        name: str,
        payload: Mapping[str, Any],
        key: str | None = None,
        source: str | None = None,
        now: float | None = None,
    ) -> tuple[int, bool]:
        """Insert into the inbox; returns (id, duplicate). A known idempotency key returns its first id.

        Blocks until the event is committed. A payload holding NaN/infinity, or nested deeper than
        MAX_JSON_DEPTH (64) levels, raises NotJSONError (a ValueError): once stored they would break
        every later read (GET /events) and every forward to a peer. (REST bodies are refused earlier,
        by the app; this catches sensors and `ctx.emit`.)
        """
        return self.submit_event(name, payload, key, source, now).result()

    def submit_event(
        self,
        name: str,
        payload: Mapping[str, Any],
        key: str | None = None,
        source: str | None = None,
        now: float | None = None,
    ) -> Future[Accepted]:
        """`add_event` without waiting: the Future resolves to (id, duplicate) once committed.

        Validation errors raise here, in the caller's thread; a failed commit is the Future's error.
        Async callers: `await asyncio.wrap_future(store.submit_event(...))` (no thread-pool hop).
        """
        check_depth(payload, f"event {name!r} payload")  # first: the NaN walk below recurses
        check_finite(payload, f"event {name!r} payload")
        row = EventRow(
            name=name,
            payload_json=json.dumps(dict(payload)),
            key=key or f"auto:{uuid.uuid4().hex}",
            source=source,
            received_at=time.time() if now is None else now,
        )
        return self._inbox().submit(row)

    def listen_inbox(self, fn: Callable[[list[Event]], None]) -> Callable[[], None]:
        """Call `fn` with each committed group of new events, in id order, from the writer thread
        (keep it short: hand over to your loop). Returns a function that stops the calls."""

        def listener(fresh: list[tuple[int, EventRow]]) -> None:
            if fresh:
                fn([event_from_row(i, r) for i, r in fresh])

        writer = self._inbox()
        writer.listeners.append(listener)
        return lambda: writer.listeners.remove(listener) if listener in writer.listeners else None

    @staticmethod
    def _event(row: Any) -> Event:
        return Event(
            name=row.name,
            payload=row.payload,
            id=row.id,
            key=row.idempotency_key,
            source=row.source,
            received_at=row.received_at,
        )

    def pending_events(self, after_id: int = 0, limit: int = 100) -> list[Event]:
        """Pending events in arrival order (id ascending), strictly after `after_id`."""
        with self.engine.connect() as conn:
            return [self._event(r) for r in conn.execute(PENDING, {"after": after_id, "lim": limit})]

    def list_events(self, status: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Newest first, for GET /events."""
        q = sa.select(events).order_by(events.c.id.desc()).limit(limit)
        if status:
            q = q.where(events.c.status == status)
        with self.engine.connect() as conn:
            out = []
            for r in conn.execute(q):
                item = self._event(r).to_json()
                item["status"] = r.status
                item["processed_at"] = r.processed_at
                out.append(item)
            return out

    def count_events(self, status: str | None = None) -> int:
        q = sa.select(sa.func.count()).select_from(events)
        if status:
            q = q.where(events.c.status == status)
        with self.engine.connect() as conn:
            return int(conn.execute(q).scalar_one())

    def submit_done(self, event_id: int, now: float) -> Future[Accepted]:
        """Mark an event done through the inbox writer (an event no strategy matched: nothing else
        to record). Resolves once committed; `await asyncio.wrap_future(...)` from async code."""
        return self._inbox().submit(Done(event_id, now))

    def finish_event(self, event_id: int, outcomes: Mapping[str, Any], now: float) -> None:
        """Mark an event done (after all its actions finished) and attach the outcomes to its decisions."""
        with self._write, self.engine.begin() as conn:
            conn.execute(FINISH_EVENT, {"eid": event_id, "at": now})
            if outcomes:
                for row in conn.execute(
                    sa.select(decisions.c.id, decisions.c.actions).where(
                        decisions.c.event_id == event_id, decisions.c.result == "fired"
                    )
                ):
                    mine = {a["key"]: outcomes[a["key"]] for a in row.actions if a["key"] in outcomes}
                    conn.execute(decisions.update().where(decisions.c.id == row.id).values(outcomes=mine))

    # -- decisions ------------------------------------------------------------------------------
    def max_decided_event(self) -> int:
        """Highest event id with decisions: events above it need no resume lookup (intents_for)."""
        with self.engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.max(decisions.c.event_id))).scalar() or 0)

    def record_plan(
        self,
        event_id: int,
        plan_decisions: Sequence[Decision],
        states: Mapping[str, StrategyState] | None,
        finish_at: float | None = None,
    ) -> None:
        """Decisions of one event and the new strategy states, in one transaction (see module doc).

        `states=None`: unchanged, not rewritten. `finish_at` also marks the event done in the same
        transaction (a plan with no actions): then an event that matched nothing leaves no row.
        """
        rows = [
            {
                "event_id": event_id,
                "event_name": d.event_name,
                "strategy": d.strategy,
                "constraint_text": d.constraint,
                "result": d.result,
                "reason": d.reason,
                "inputs": d.inputs,
                "actions": [i.to_json() for i in d.intents],
                "outcomes": None,
                "at": d.at,
            }
            for d in plan_decisions
        ]
        with self._write, self.engine.begin() as conn:
            if rows:
                conn.execute(INSERT_DECISIONS, rows)
            # A marker row so an unfinished event that matched nothing is still known as "decided".
            elif finish_at is None:
                conn.execute(
                    decisions.insert().values(
                        event_id=event_id,
                        event_name="",
                        strategy="",
                        constraint_text="",
                        result="none",
                        reason="no strategy matched",
                        inputs={},
                        actions=[],
                        at=time.time(),
                    )
                )
            if states is not None:
                self._put(conn, STRATEGY_STATES_KEY, {k: v.to_json() for k, v in states.items()})
            if finish_at is not None:
                conn.execute(FINISH_EVENT, {"eid": event_id, "at": finish_at})

    def intents_for(self, event_id: int) -> list[Intent] | None:
        """The intents already decided for this event, or None if it was never decided."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(decisions.c.result, decisions.c.actions)
                .where(decisions.c.event_id == event_id)
                .order_by(decisions.c.id)
            ).all()
        if not rows:
            return None
        return [Intent.from_json(a) for r in rows if r.result == "fired" for a in r.actions]

    def list_decisions(self, limit: int = 100, strategy: str | None = None,
                       before_id: int | None = None) -> list[dict[str, Any]]:
        """The newest `limit` decisions, newest first; `before_id` pages back (the ids of a page's last
        row: the next page is everything older)."""
        q = (
            sa.select(decisions)
            .where(decisions.c.result != "none")
            .order_by(decisions.c.id.desc())
            .limit(limit)
        )
        if strategy:
            q = q.where(decisions.c.strategy == strategy)
        if before_id is not None:
            q = q.where(decisions.c.id < before_id)
        with self.engine.connect() as conn:
            return [
                {
                    "id": r.id,
                    "event_id": r.event_id,
                    "event_name": r.event_name,
                    "strategy": r.strategy,
                    "constraint": r.constraint_text,
                    "result": r.result,
                    "reason": r.reason,
                    "inputs": r.inputs,
                    "actions": r.actions,
                    "outcomes": r.outcomes,
                    "at": r.at,
                }
                for r in conn.execute(q)
            ]

    def strategy_states(self) -> dict[str, StrategyState]:
        raw = self.get(STRATEGY_STATES_KEY) or {}
        return {k: StrategyState.from_json(v) for k, v in raw.items()}

    # -- actions --------------------------------------------------------------------------------
    def get_action(self, key: str) -> ActionRecord | None:
        with self.engine.connect() as conn:
            r = conn.execute(ACTION_BY_KEY, {"k": key}).first()
        if r is None:
            return None
        return action_record(r)

    def start_action(
        self,
        key: str,
        actuator: str,
        agent: str | None,
        args: Mapping[str, Any],
        event_id: int | None,
        now: float,
    ) -> int:
        """Record an attempt (status 'started'); returns the attempt number (1 for the first)."""
        with self._write, self.engine.begin() as conn:
            r = conn.execute(ACTION_ATTEMPTS, {"k": key}).first()
            if r is None:
                row = {
                    "key": key,
                    "actuator": actuator,
                    "agent": agent,
                    "args": dict(args),
                    "status": "started",
                    "attempts": 1,
                    "event_id": event_id,
                    "started_at": now,
                }
                conn.execute(INSERT_ACTION, row)
                return 1
            attempts = int(r.attempts) + 1
            conn.execute(RESTART_ACTION, {"k": key, "n": attempts, "at": now})
            return attempts

    def finish_action(
        self,
        key: str,
        status: ActionStatus,
        result: Mapping[str, Any] | None,
        error: str | None,
        now: float,
    ) -> None:
        with self._write, self.engine.begin() as conn:
            res = dict(result) if result is not None else None
            conn.execute(FINISH_ACTION, {"k": key, "st": status, "res": res, "err": error, "at": now})

    def list_actions(self, status: str | None = None, limit: int = 1000) -> list[ActionRecord]:
        q = sa.select(actions).order_by(actions.c.started_at).limit(limit)
        if status:
            q = q.where(actions.c.status == status)
        with self.engine.connect() as conn:
            return [
                action_record(r)
                for r in conn.execute(q)
            ]

    def last_successes(self) -> dict[str, float]:
        """actuator (and 'agent.actuator' for remote ones) -> time it last succeeded; feeds since()."""
        q = (
            sa.select(actions.c.actuator, actions.c.agent, sa.func.max(actions.c.finished_at))
            .where(actions.c.status == "succeeded")
            .group_by(actions.c.actuator, actions.c.agent)
        )
        out: dict[str, float] = {}
        with self.engine.connect() as conn:
            for actuator, agent, at in conn.execute(q):
                if at is None:
                    continue
                names = [actuator] + ([f"{agent}.{actuator}"] if agent else [])
                for n in names:
                    out[n] = max(out.get(n, 0.0), float(at))
        return out

    # -- key/value: agent state, strategy states, sensor watermarks, REST strategies ------------
    @staticmethod
    def _put(conn: sa.Connection, key: str, value: Any) -> None:
        if not conn.execute(KV_UPDATE, {"k": key, "v": value}).rowcount:
            conn.execute(KV_INSERT, {"key": key, "value": value})

    def put(self, key: str, value: Any) -> None:
        with self._write, self.engine.begin() as conn:
            self._put(conn, key, value)

    def get(self, key: str, default: Any = None) -> Any:
        with self.engine.connect() as conn:
            v = conn.execute(sa.select(kv.c.value).where(kv.c.key == key)).scalar_one_or_none()
        return default if v is None else v

    def put_many(self, items: Iterable[tuple[str, Any]]) -> None:
        with self._write, self.engine.begin() as conn:
            for k, v in items:
                self._put(conn, k, v)
