"""The agent store's schema: its four tables, the statements its hot path runs, the typed action record,
and the engine (SQLite pragmas) it runs on.

Separate from scanflow.agent.store, whose Store class holds the transactions (what is written together
and why): this module is what the data looks like and how to reach it, read also by tests that look at
the tables directly.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_delay, wait_exponential

from scanflow.agent.inbox import EventRow
from scanflow.agent.types import Event

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
FINISH_EVENT = (
    events.update()
    .where(events.c.id == sa.bindparam("eid"))
    .values(status="done", processed_at=sa.bindparam("at"))
)
INSERT_DECISIONS = decisions.insert()
KV_UPDATE = kv.update().where(kv.c.key == sa.bindparam("k")).values(value=sa.bindparam("v"))
KV_INSERT = kv.insert()
PENDING = (
    sa.select(events)
    .where(events.c.status == "pending", events.c.id > sa.bindparam("after"))
    .order_by(events.c.id)
    .limit(sa.bindparam("lim"))
)

ACTION_BY_KEY = sa.select(actions).where(actions.c.key == sa.bindparam("k"))
ACTION_ATTEMPTS = sa.select(actions.c.attempts).where(actions.c.key == sa.bindparam("k"))
INSERT_ACTION = actions.insert()
RESTART_ACTION = (
    actions.update()
    .where(actions.c.key == sa.bindparam("k"))
    .values(status="started", attempts=sa.bindparam("n"), started_at=sa.bindparam("at"), error=None)
)
FINISH_ACTION = (
    actions.update()
    .where(actions.c.key == sa.bindparam("k"))
    .values(
        status=sa.bindparam("st"),
        result=sa.bindparam("res"),
        error=sa.bindparam("err"),
        finished_at=sa.bindparam("at"),
    )
)


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


def make_engine(url: str) -> Engine:
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
    # a connect to a server behind a dropping firewall would otherwise hang for the kernel's SYN
    # retries (~2 min) on every attempt; 10 s is ample for a server that answers at all
    args = {"connect_timeout": CONNECT_TIMEOUT_S} if url.startswith("postgresql") else {}
    return sa.create_engine(url, pool_pre_ping=True, connect_args=args)


log = logging.getLogger(__name__)

# how long an agent waits at start for its database server: on Kubernetes the agents and PostgreSQL
# start together, and an agent that exits at once is restarted with a growing back-off (10 s, 20 s,
# 40 s, ...) long after the server is up
SERVER_WAIT_S = 120.0
CONNECT_TIMEOUT_S = 10  # one connection attempt to a PostgreSQL server (psycopg2's connect_timeout)
# refusals that waiting does not cure: wrong credentials, a role or database that does not exist
_PERMANENT = ("authentication failed", "does not exist", "no pg_hba.conf entry")


def _server_not_up(exc: BaseException) -> bool:
    return isinstance(exc, sa.exc.OperationalError) and not any(p in str(exc) for p in _PERMANENT)


def wait_for_server(engine: Engine, wait_s: float = SERVER_WAIT_S) -> None:
    """Connect once, retrying a refused or dropped connection with backoff (at most 5 s apart) for up
    to `wait_s` (each attempt bounded by CONNECT_TIMEOUT_S); then the last error is raised, as is at
    once a refusal waiting cannot cure (credentials, a missing role or database). File-backed SQLite needs no server: returns at once.
    Each retry is logged with the URL's password hidden and the driver's first line only."""
    if engine.url.get_backend_name() == "sqlite":
        return
    where = engine.url.render_as_string(hide_password=True)

    def say(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        first = str(getattr(exc, "orig", exc)).strip().splitlines()[:1]
        log.warning("database server at %s not reachable yet (%s); waiting up to %.0f s in all", where,
                    first[0] if first else type(exc).__name__, wait_s)

    for attempt in Retrying(retry=retry_if_exception(_server_not_up), reraise=True,
                            stop=stop_after_delay(wait_s), wait=wait_exponential(multiplier=0.5, max=5),
                            before_sleep=say):
        with attempt, engine.connect():
            pass


def action_record(r: Any) -> ActionRecord:
    """One `actions` row as the typed record (the column order of ActionRecord)."""
    return ActionRecord(
        r.key, r.actuator, r.agent, r.args, r.status, r.result, r.error, r.attempts, r.event_id,
        r.started_at, r.finished_at,
    )


def event_from_row(event_id: int, row: EventRow) -> Event:
    """A just-committed row as the Event the loop would read back (payload through JSON, as stored)."""
    return Event(
        name=row.name,
        payload=json.loads(row.payload_json),
        id=event_id,
        key=row.key,
        source=row.source,
        received_at=row.received_at,
    )
