"""The agent's durable store: events inbox, decisions, action outcomes, agent state, sensor watermarks.

Why: "nothing lost". An agent killed at any moment resumes where it was: accepted events stay
pending until every action they caused has finished; decisions are written in the same transaction
as the strategy states they changed (so a restart neither re-decides nor forgets a cooldown); each
action is keyed by its idempotency key, so one that succeeded is never run again.

SQLAlchemy 2 Core on any URL; SQLite (the default, one file per agent) runs in WAL mode with a busy
timeout, and writes from this process go through one lock (one writer). New events go through the
inbox writer thread (scanflow.agent.inbox: group commit, driver-level insert, WAL checkpoints off the
request path); `submit_event` returns its Future for async callers. Every other method is synchronous
and may block: async callers use `await asyncio.to_thread(store.method, ...)`.
Who calls: scanflow.agent.runtime (the loop), scanflow.agent.app (REST reads), tests, benchmarks.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from scanflow.agent.engine import Decision, Intent, StrategyState
from scanflow.agent.inbox import Accepted, Checkpointer, Done, EventRow, InboxWriter
from scanflow.agent.jsonsafe import check_depth, check_finite
from scanflow.agent.types import Event
from scanflow.sqlschema import create_tables

ActionStatus = Literal["started", "succeeded", "failed"]

metadata = sa.MetaData()

events = sa.Table(
    "events",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("payload", sa.JSON, nullable=False),
    sa.Column("idempotency_key", sa.String(255), nullable=False, unique=True),
    sa.Column("source", sa.String(200)),
    sa.Column("status", sa.String(16), nullable=False, default="pending"),
    sa.Column("received_at", sa.Float, nullable=False),
    sa.Column("processed_at", sa.Float),
    sa.Index("ix_events_status_id", "status", "id"),
    sqlite_autoincrement=True,
)

decisions = sa.Table(
    "decisions",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("event_id", sa.Integer, nullable=False, index=True),
    sa.Column("event_name", sa.String(200), nullable=False),
    sa.Column("strategy", sa.String(100), nullable=False, index=True),
    sa.Column("constraint_text", sa.Text, nullable=False),
    sa.Column("result", sa.String(16), nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("inputs", sa.JSON, nullable=False),
    sa.Column("actions", sa.JSON, nullable=False),
    sa.Column("outcomes", sa.JSON),
    sa.Column("at", sa.Float, nullable=False),
)

actions = sa.Table(
    "actions",
    metadata,
    sa.Column("key", sa.String(255), primary_key=True),
    sa.Column("actuator", sa.String(200), nullable=False),
    sa.Column("agent", sa.String(200)),
    sa.Column("args", sa.JSON, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("result", sa.JSON),
    sa.Column("error", sa.Text),
    sa.Column("attempts", sa.Integer, nullable=False, default=0),
    sa.Column("event_id", sa.Integer),
    sa.Column("started_at", sa.Float, nullable=False),
    sa.Column("finished_at", sa.Float),
)

kv = sa.Table(
    "kv",
    metadata,
    sa.Column("key", sa.String(255), primary_key=True),
    sa.Column("value", sa.JSON, nullable=False),
)

# Hot-path statements built once: building a statement costs more than running it on SQLite.
_FINISH_EVENT = (
    events.update()
    .where(events.c.id == sa.bindparam("eid"))
    .values(status="done", processed_at=sa.bindparam("at"))
)
_INSERT_DECISIONS = decisions.insert()
_KV_UPDATE = kv.update().where(kv.c.key == sa.bindparam("k")).values(value=sa.bindparam("v"))
_KV_INSERT = kv.insert()
_PENDING = (
    sa.select(events)
    .where(events.c.status == "pending", events.c.id > sa.bindparam("after"))
    .order_by(events.c.id)
    .limit(sa.bindparam("lim"))
)

_ACTION_BY_KEY = sa.select(actions).where(actions.c.key == sa.bindparam("k"))
_ACTION_ATTEMPTS = sa.select(actions.c.attempts).where(actions.c.key == sa.bindparam("k"))
_INSERT_ACTION = actions.insert()
_RESTART_ACTION = (
    actions.update()
    .where(actions.c.key == sa.bindparam("k"))
    .values(status="started", attempts=sa.bindparam("n"), started_at=sa.bindparam("at"), error=None)
)
_FINISH_ACTION = (
    actions.update()
    .where(actions.c.key == sa.bindparam("k"))
    .values(
        status=sa.bindparam("st"),
        result=sa.bindparam("res"),
        error=sa.bindparam("err"),
        finished_at=sa.bindparam("at"),
    )
)

STATE_KEY = "agent_state"
STRATEGY_STATES_KEY = "strategy_states"
REST_STRATEGIES_KEY = "rest_strategies"
WATERMARK_PREFIX = "sensor_watermark:"


@dataclass(frozen=True)
class ActionRecord:
    """One row of the actions table: what happened to the action with this idempotency key."""

    key: str
    actuator: str
    agent: str | None
    args: dict[str, Any]
    status: ActionStatus
    result: dict[str, Any] | None
    error: str | None
    attempts: int
    event_id: int | None
    started_at: float
    finished_at: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "actuator": self.actuator,
            "agent": self.agent,
            "status": self.status,
            "result": self.result,
            "error": self.error,
            "attempts": self.attempts,
            "event_id": self.event_id,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
        }


def _make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = sa.create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @sa.event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            if ":memory:" not in url and url not in ("sqlite://", "sqlite:///"):
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA wal_autocheckpoint=0")  # the Checkpointer thread does it (inbox.py)
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: committed data survives a process kill
            cur.close()

        return engine
    return sa.create_engine(url, pool_pre_ping=True)


PG_OWNER_LOCK = 0x5CA9F10  # the advisory lock key an agent holds on its PostgreSQL store (claim)


class StoreBusyError(RuntimeError):
    """Another running process already owns this store: two loops would act on the same events."""


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
            self.engine = _make_engine(url)
        path = self._file()
        if path is not None:
            # a fresh volume (an emptyDir mounted at /tmp while SCANFLOW_STORE_URL points at
            # /tmp/scanflow/<agent>.db) has no directory yet: SQLite cannot create it, and the agent
            # would crash-loop on "unable to open database file"
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._write = threading.Lock()
        self._owner_fd: int | None = None
        self._owner_conn: sa.Connection | None = None  # PostgreSQL: the session holding the owner lock
        self._pg_claimed = False  # claimed on PostgreSQL (and not released): verify_claim keeps it
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

    def claim(self) -> None:
        """Become the only running agent on this store: an flock on '<db>.owner' for a SQLite file, a
        session advisory lock for PostgreSQL.

        A restarted agent whose previous process is still alive would run every pending action a
        second time (two Executors during a rollout would both act on one plan); this refuses it with
        a clear error instead. The OS drops the flock when the owner dies, and PostgreSQL drops the
        advisory lock when the owner's connection closes (a SIGKILLed process's socket closes with
        it). Other databases: no-op (run one agent replica per store).
        """
        if self.engine.url.get_backend_name() == "postgresql":
            self._claim_postgres()
            return
        path = self._file()
        if path is None or self._owner_fd is not None:
            return
        fd = os.open(path + ".owner", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreBusyError(
                f"another running agent process owns the store {path}; stop it first "
                "(or give this one its own SCANFLOW_HOME / SCANFLOW_STORE_URL)"
            ) from None
        self._owner_fd = fd

    def _claim_postgres(self) -> None:
        """pg_try_advisory_lock on a connection kept open for the process's life (advisory locks are
        per database, and each agent has its own database)."""
        if self._owner_conn is not None:
            return
        conn = self.engine.connect()
        got = conn.execute(sa.text("SELECT pg_try_advisory_lock(:k)"), {"k": PG_OWNER_LOCK}).scalar()
        conn.commit()  # the lock is the session's: it outlives the transaction, which must not idle open
        if not got:
            conn.close()
            raise StoreBusyError(
                f"another running agent process owns the store {self.engine.url.render_as_string(hide_password=True)}; "
                "stop it first (or give this one its own SCANFLOW_STORE_URL database)"
            )
        self._owner_conn = conn
        self._pg_claimed = True

    @property
    def claims_by_session(self) -> bool:
        """True when this store's claim lives in a database session (PostgreSQL), which can drop while
        the process runs on: `verify_claim` should then be called now and then."""
        return self._pg_claimed

    def verify_claim(self) -> bool:
        """Whether this process still holds the PostgreSQL owner lock it claimed: True when its session
        still holds it; False when that session had dropped (a network blip, a server restart, an idle
        connection killed by a proxy: the server then released the lock) and the lock was free, so this
        call took it again on a new session. Raises StoreBusyError when another process owns the store
        now (it claimed it in the gap: this process must stop acting), and sqlalchemy's OperationalError
        when the server cannot be reached (nobody can take the lock then; call again later).

        Why: the claim is only as good as the session holding it. Without this check a process whose
        session dropped would keep acting beside the agent that claimed the store after it. No-op (True)
        for SQLite files, whose flock lives as long as the process."""
        if not self._pg_claimed:
            return True
        conn = self._owner_conn
        if conn is not None:  # None: lost before, while the server could not be reached
            try:
                held = conn.execute(sa.text(
                    "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted "
                    "AND pid = pg_backend_pid() AND ((classid::bigint << 32) | objid::bigint) = :k)"),
                    {"k": PG_OWNER_LOCK}).scalar()
                conn.commit()
                if held:
                    return True
            except sa.exc.SQLAlchemyError:
                pass  # the session is gone, and the lock with it
            with contextlib.suppress(sa.exc.SQLAlchemyError):
                conn.close()
            self._owner_conn = None
        self._claim_postgres()  # StoreBusyError: another process took it in the gap
        return False

    def release(self) -> None:
        self._pg_claimed = False
        if self._owner_conn is not None:
            try:
                self._owner_conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": PG_OWNER_LOCK})
                self._owner_conn.commit()
            except sa.exc.SQLAlchemyError:
                pass  # the server is gone: so is the lock
            self._owner_conn.close()
            self._owner_conn = None
        if self._owner_fd is not None:
            fcntl.flock(self._owner_fd, fcntl.LOCK_UN)
            os.close(self._owner_fd)
            self._owner_fd = None

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
                fn([_event_from_row(i, r) for i, r in fresh])

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
            return [self._event(r) for r in conn.execute(_PENDING, {"after": after_id, "lim": limit})]

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
            conn.execute(_FINISH_EVENT, {"eid": event_id, "at": now})
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
                conn.execute(_INSERT_DECISIONS, rows)
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
                conn.execute(_FINISH_EVENT, {"eid": event_id, "at": finish_at})

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
            r = conn.execute(_ACTION_BY_KEY, {"k": key}).first()
        if r is None:
            return None
        return _action_record(r)

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
            r = conn.execute(_ACTION_ATTEMPTS, {"k": key}).first()
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
                conn.execute(_INSERT_ACTION, row)
                return 1
            attempts = int(r.attempts) + 1
            conn.execute(_RESTART_ACTION, {"k": key, "n": attempts, "at": now})
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
            conn.execute(_FINISH_ACTION, {"k": key, "st": status, "res": res, "err": error, "at": now})

    def list_actions(self, status: str | None = None, limit: int = 1000) -> list[ActionRecord]:
        q = sa.select(actions).order_by(actions.c.started_at).limit(limit)
        if status:
            q = q.where(actions.c.status == status)
        with self.engine.connect() as conn:
            return [
                _action_record(r)
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
        if not conn.execute(_KV_UPDATE, {"k": key, "v": value}).rowcount:
            conn.execute(_KV_INSERT, {"key": key, "value": value})

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


def _action_record(r: Any) -> ActionRecord:
    """One `actions` row as the typed record (the column order of ActionRecord)."""
    return ActionRecord(
        r.key, r.actuator, r.agent, r.args, r.status, r.result, r.error, r.attempts, r.event_id,
        r.started_at, r.finished_at,
    )


def _event_from_row(event_id: int, row: EventRow) -> Event:
    """A just-committed row as the Event the loop would read back (payload through JSON, as stored)."""
    return Event(
        name=row.name,
        payload=json.loads(row.payload_json),
        id=event_id,
        key=row.key,
        source=row.source,
        received_at=row.received_at,
    )
