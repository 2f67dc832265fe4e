"""Creating a database's tables when several processes may start on it at once.

Who calls it: the agents' store (scanflow/agent/store.py) and the Tracker's prediction and feedback logs
(scanflow/tracking/predictions.py, scanflow/tracking/feedback.py), at construction.

Why: `MetaData.create_all` checks, then creates, table by table. Two processes starting at once on a fresh
PostgreSQL database (two Executors during a rollout, Tracker replicas) both find no table and both create
it; the second one failed with a UniqueViolation on `pg_type` (a traceback, seen in the test that starts
two agents at once) instead of starting, or being refused with the store's clear "another running agent
process owns the store". On PostgreSQL the check-and-create now runs under a transaction-scoped advisory
lock: the second process waits for the first one's commit, then finds the tables. SQLite serialises
writers with its database lock, and its path is left as it was.
"""

from __future__ import annotations

import sqlalchemy as sa

SCHEMA_LOCK = 0x5CA95C4E  # the pg_advisory_xact_lock key of table creation (any fixed int64)


def create_tables(metadata: sa.MetaData, engine: sa.Engine) -> None:
    """`metadata.create_all` on `engine`, one process at a time on PostgreSQL."""
    if engine.dialect.name != "postgresql":
        metadata.create_all(engine)
        return
    with engine.begin() as conn:
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(SCHEMA_LOCK)))
        metadata.create_all(conn)
