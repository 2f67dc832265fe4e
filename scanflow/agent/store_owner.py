"""One running agent per store: the owner lock an agent takes on its store at start and holds until it
stops (an flock beside a SQLite file, a session advisory lock on PostgreSQL).

Separate from scanflow.agent.store: the claim is about processes, not data (no table, no transaction),
and on PostgreSQL it lives in a session of its own that can drop while the process runs on, which is
what `OwnerLock.verify_claim` and the runtime's `watch_claim` task are for.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.engine import Engine

PG_OWNER_LOCK = 0x5CA9F10  # the advisory lock key an agent holds on its PostgreSQL store (claim)


class StoreBusyError(RuntimeError):
    """Another running process already owns this store: two loops would act on the same events."""


class OwnerLock:
    """The claim of one process on one store's database (`engine`); `path` is the SQLite file, None for
    an in-memory or non-SQLite database."""

    def __init__(self, engine: Engine, path: str | None) -> None:
        self.engine = engine
        self.path = path
        self._fd: int | None = None
        self._conn: sa.Connection | None = None  # PostgreSQL: the session holding the owner lock
        self._pg_claimed = False  # claimed on PostgreSQL (and not released): verify_claim keeps it

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
        path = self.path
        if path is None or self._fd is not None:
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
        self._fd = fd

    def _claim_postgres(self) -> None:
        """pg_try_advisory_lock on a connection kept open for the process's life (advisory locks are
        per database, and each agent has its own database)."""
        if self._conn is not None:
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
        self._conn = conn
        self._pg_claimed = True

    @property
    def claims_by_session(self) -> bool:
        """True when the store's claim lives in a database session (PostgreSQL), which can drop while
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
        conn = self._conn
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
            self._conn = None
        self._claim_postgres()  # StoreBusyError: another process took it in the gap
        return False

    def release(self) -> None:
        self._pg_claimed = False
        if self._conn is not None:
            try:
                self._conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": PG_OWNER_LOCK})
                self._conn.commit()
            except sa.exc.SQLAlchemyError:
                pass  # the server is gone: so is the lock
            self._conn.close()
            self._conn = None
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


async def watch_claim(verify_claim: Callable[[], bool], every_s: float, log: logging.Logger,
                      on_lost: Callable[[], None]) -> None:
    """PostgreSQL stores: every `every_s` (`claim_check_s`), check that this process's session still holds
    the store's owner lock (`verify_claim`, run in a worker thread). A dropped session is taken again when
    nobody else took the lock; when another process did, `on_lost` makes this one stop acting at once (the
    runtime cancels its loop and sensors) and shut down (SIGTERM to itself: the server's graceful exit),
    so two agents never act on one store for longer than one check interval. A server that cannot be
    reached is retried: nobody can take the lock meanwhile."""
    while True:
        await asyncio.sleep(every_s)
        try:
            kept = await asyncio.to_thread(verify_claim)
        except StoreBusyError as exc:
            log.critical("this agent lost its store to another process, so it stops acting and "
                         "shuts down: %s", exc)
            on_lost()
            return
        except sa.exc.SQLAlchemyError as exc:
            log.warning("cannot check the store's owner lock (%s); checking again in %.0f s",
                        type(exc).__name__, every_s)
            continue
        if not kept:
            log.warning("the store session holding the owner lock had dropped; the lock was free "
                        "and is held again")
