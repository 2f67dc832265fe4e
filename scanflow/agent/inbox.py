"""The inbox writer: one thread that commits accepted events in groups, and a WAL checkpointer.

Why: POST /events must answer only once its event is committed ("nothing lost"), and that commit is
the hot path of every agent. A SQLAlchemy `engine.begin()` insert costs about three times the CPU of
an insert through the driver; a thread-pool hop per request competes with the loop for the one write
lock; and every ~1000 WAL pages SQLite's automatic checkpoint runs two fsyncs inside whichever commit
crossed the line, under the write lock, so the request behind it stalls (the round trip's p99; figures
in docs/architecture.md). So:

- `InboxWriter`: callers enqueue a prepared row (or a `Done` mark) and get a Future; one thread takes
  everything queued,
  inserts it in one transaction (group commit: N concurrent requests, one commit), and resolves each
  Future only after COMMIT returned. Ids therefore follow commit order, and a known idempotency key
  resolves to its first id (duplicate=True), within a group too.
- `Checkpointer` (file-backed SQLite only): the automatic checkpoint is off on this process's
  connections; this thread runs PASSIVE checkpoints on its own connection, kicked every
  `KICK_EVERY` commits and at least every `IDLE_CHECKPOINT_S`. PASSIVE never blocks writers, so the
  fsyncs leave the request path. WAL + synchronous=NORMAL: a committed event survives SIGKILL of the
  agent (the WAL is in the OS page cache); only an OS crash or power loss can drop the last commits.

Who calls: scanflow.agent.store.Store (creates both lazily, stops them in close()).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

log = logging.getLogger(__name__)

MAX_GROUP = 256  # rows per transaction: bounds one commit's latency under a burst
KICK_EVERY = 100  # commits between checkpoint requests (~4-5 WAL pages each: under the 1000 default)
IDLE_CHECKPOINT_S = 1.0


@dataclass(frozen=True)
class EventRow:
    """One event ready to insert (validated by the caller: finite JSON payload, name, key)."""

    name: str
    payload_json: str
    key: str
    source: str | None
    received_at: float

    def as_params(self) -> dict[str, Any]:
        """The row for SQLAlchemy Core (its JSON column serialises the payload itself)."""
        return {
            "name": self.name,
            "payload": json.loads(self.payload_json),
            "idempotency_key": self.key,
            "source": self.source,
            "status": "pending",
            "received_at": self.received_at,
        }


@dataclass(frozen=True)
class Done:
    """Mark an event done with nothing recorded beside it (no strategy matched): the loop's most
    common write, grouped with the inserts rather than a thread-pool hop and a SQLAlchemy commit."""

    event_id: int
    at: float


Accepted = tuple[int, bool]  # (event id, duplicate); a Done job resolves to (event_id, False)
_Job = tuple["EventRow | Done", "Future[Accepted]"]

# Look the key up first rather than INSERT .. ON CONFLICT DO NOTHING: the latter burns an
# AUTOINCREMENT id on every duplicate. Safe: BEGIN IMMEDIATE holds SQLite's write lock meanwhile.
_SQLITE_INSERT = (
    "INSERT INTO events (name, payload, idempotency_key, source, status, received_at) "
    "VALUES (?, ?, ?, ?, 'pending', ?)"
)
_SQLITE_ID_BY_KEY = "SELECT id FROM events WHERE idempotency_key = ?"
_SQLITE_DONE = "UPDATE events SET status = 'done', processed_at = ? WHERE id = ?"


def connect_sqlite(path: str) -> sqlite3.Connection:
    """A driver connection for one of this module's threads: WAL, NORMAL sync, no auto-checkpoint,
    explicit transactions (isolation_level=None: BEGIN/COMMIT are ours)."""
    conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=30000")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    return conn


class InboxWriter:
    """A single writer thread with group commit for the events table.

    `write_lock` is the store's lock for writes from this process: held for each group's
    transaction so the loop's SQLAlchemy writes and this thread never wait on SQLite's busy handler.
    `sqlite_path`: insert through the sqlite3 driver on a private connection (file-backed SQLite);
    None: through SQLAlchemy Core on `engine` (any database, in-memory SQLite included).
    `on_commit` is called from the writer thread after each group committed (the checkpoint kick).
    `listeners` are called there too, in commit order, with the new (not duplicate) events of each
    group as (id, row) pairs: the agent loop takes them from memory instead of querying the inbox.
    """

    def __init__(
        self,
        engine: Engine,
        events_table: sa.Table,
        write_lock: threading.Lock,
        sqlite_path: str | None,
        on_commit: Callable[[], None] | None = None,
    ) -> None:
        self._engine = engine
        self._events = events_table
        self._lock = write_lock
        self._path = sqlite_path
        self._on_commit = on_commit
        self.listeners: list[Callable[[list[tuple[int, EventRow]]], None]] = []
        self._queue: list[_Job] = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="scanflow-inbox-writer", daemon=True)
        self._thread.start()

    def submit(self, row: EventRow | Done) -> Future[Accepted]:
        """Enqueue one row (or Done); the Future resolves to (id, duplicate) once its group is
        committed. Jobs are applied in submission order."""
        fut: Future[Accepted] = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("the store is closed")
            self._queue.append((row, fut))
            self._cond.notify()
        return fut

    def close(self) -> None:
        """Commit what is queued, then stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()

    def _run(self) -> None:
        raw = connect_sqlite(self._path) if self._path else None
        try:
            while True:
                with self._cond:
                    while not self._queue and not self._closed:
                        self._cond.wait()
                    if not self._queue:
                        return  # closed and drained
                    group, self._queue = self._queue[:MAX_GROUP], self._queue[MAX_GROUP:]
                live = [(row, fut) for row, fut in group if fut.set_running_or_notify_cancel()]
                if not live:
                    continue
                try:
                    with self._lock:
                        results = self._commit_sqlite(raw, live) if raw else self._commit_sa(live)
                except BaseException as exc:  # noqa: BLE001 - every waiter must hear about it
                    log.warning("inbox commit of %d event(s) failed: %s", len(live), type(exc).__name__)
                    for _, fut in live:
                        fut.set_exception(exc)
                    continue
                fresh = [
                    (res[0], row)
                    for (row, _), res in zip(live, results, strict=True)
                    if isinstance(row, EventRow) and not res[1]
                ]
                for listener in list(self.listeners):
                    try:
                        listener(fresh)
                    except Exception:  # a listener is an optimisation, never a failure
                        log.exception("inbox listener failed")
                for (_, fut), res in zip(live, results, strict=True):
                    fut.set_result(res)
                if self._on_commit is not None:
                    self._on_commit()
        finally:
            if raw is not None:
                raw.close()

    @staticmethod
    def _commit_sqlite(conn: sqlite3.Connection, group: list[_Job]) -> list[Accepted]:
        out: list[Accepted] = []
        conn.execute("BEGIN IMMEDIATE")
        try:
            for row, _ in group:
                if isinstance(row, Done):
                    conn.execute(_SQLITE_DONE, (row.at, row.event_id))
                    out.append((row.event_id, False))
                    continue
                known = conn.execute(_SQLITE_ID_BY_KEY, (row.key,)).fetchone()
                if known is not None:  # the key exists (earlier, or earlier in this group)
                    out.append((int(known[0]), True))
                    continue
                cur = conn.execute(
                    _SQLITE_INSERT, (row.name, row.payload_json, row.key, row.source, row.received_at)
                )
                out.append((int(cur.lastrowid or 0), False))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return out

    def _commit_sa(self, group: list[_Job]) -> list[Accepted]:
        """The same, through SQLAlchemy Core (any database). One agent process owns a store, and
        this thread is its only event writer, so nothing inserts a key between lookup and insert."""
        out: list[Accepted] = []
        ev = self._events
        by_key = sa.select(ev.c.id).where(ev.c.idempotency_key == sa.bindparam("k"))
        with self._engine.begin() as conn:
            for row, _ in group:
                if isinstance(row, Done):
                    conn.execute(
                        ev.update().where(ev.c.id == row.event_id).values(status="done", processed_at=row.at)
                    )
                    out.append((row.event_id, False))
                    continue
                known = conn.execute(by_key, {"k": row.key}).scalar_one_or_none()
                if known is not None:
                    out.append((int(known), True))
                    continue
                pk = conn.execute(self._events.insert(), row.as_params()).inserted_primary_key
                assert pk is not None
                out.append((int(pk[0]), False))
        return out


class Checkpointer:
    """Runs SQLite PASSIVE checkpoints off the request path (see the module doc)."""

    def __init__(self, sqlite_path: str) -> None:
        self._path = sqlite_path
        self._kick = threading.Event()
        self._stop = threading.Event()
        self._commits = 0
        self._thread = threading.Thread(target=self._run, name="scanflow-wal-checkpoint", daemon=True)
        self._thread.start()

    def committed(self) -> None:
        """Count one commit; every KICK_EVERY commits, wake the checkpointer (called by writers)."""
        self._commits += 1
        if self._commits >= KICK_EVERY:
            self._commits = 0
            self._kick.set()

    def close(self) -> None:
        self._stop.set()
        self._kick.set()
        self._thread.join()

    def _run(self) -> None:
        conn = connect_sqlite(self._path)
        try:
            while not self._stop.is_set():
                self._kick.wait(IDLE_CHECKPOINT_S)
                self._kick.clear()
                self.checkpoint(conn)
            self.checkpoint(conn)
        finally:
            conn.close()

    @staticmethod
    def checkpoint(conn: sqlite3.Connection) -> None:
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error as exc:  # a locked or vanished file: the next round retries
            log.warning("WAL checkpoint failed: %s", exc)
