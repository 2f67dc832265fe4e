"""Feedback: the TRUE labels of served requests, arriving late, for some requests only, by request_id.

Who calls it: the Tracker agent (through `scanflow.tracking.feedback_api.feedback_router`, which appends
what clients POST to /feedback and answers lookups), and through that router the agents that retrain
(`scanflow.tracking.feedback_client.lookup_feedback`) and the clients that know the truth
(`post_feedback`; `scanflow.embedded.traffic.Traffic` in the embedded stack).

Why a log of its own, apart from the prediction log: labels come from whoever learns the truth, later
(seconds to days) and for a part of the requests only; a prediction record is written once, when the
answer goes out. Joining the two by request_id at read time keeps both append-only.

The rules:
1. Exactly once per request_id: one row per id, inserted with ON CONFLICT DO NOTHING. A client that
   re-sends after a lost reply is acknowledged again and stored once.
2. First wins: a later record for an id already stored (even with different labels) is acknowledged,
   counted as a duplicate and dropped. Labels feed retraining: a later sender must not rewrite them.
3. `seq` grows with commit order and is never reused (SQLite AUTOINCREMENT; on PostgreSQL appends
   take a transaction-scoped advisory lock first, as the prediction log does), so a consumer paging
   with `since(after_seq)` never skips or repeats a row.
Rows are not compacted: labels are what retraining needs, and they are small.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, WithJsonSchema
from sqlalchemy import (
    Column,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    event,
    func,
    select,
)
from sqlalchemy.engine import Engine, make_url

from scanflow.sqlschema import create_tables
from scanflow.tracking.predictions import AppendResult, serialise_appends, sqlite_pragmas

MAX_LABELS = 10_000  # labels per record: one per row of the request (a replica takes at most this many rows)
MAX_LABEL_CHARS = 200  # a string label's length at most
MAX_LOOKUP_IDS = 10_000  # request ids per lookup call
LOOKUP_CHUNK = 500  # ids per IN (...) query: well below SQLite's bound variables limit
MAX_PAGE = 5_000  # rows per `since` call at most
_PG_FEEDBACK_LOCK = 0x7363616E66626B31  # pg_advisory_xact_lock key of feedback appends ("scanfbk1")

Label = int | float | str


def _label(value: Any) -> Label:
    """One label: a finite number (int or float, never a boolean) or a string of at most 200 chars.
    A plain validator (not a union) so a bad label gets one clear error at its own position."""
    if isinstance(value, bool):
        raise ValueError("a label must be a number or a string, not a boolean")  # noqa: TRY004 - pydantic wants ValueError
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("a label must be a finite number (no NaN or infinity)")
        return value
    if isinstance(value, str):
        if len(value) > MAX_LABEL_CHARS:
            raise ValueError(f"a string label has at most {MAX_LABEL_CHARS} characters, got {len(value)}")
        return value
    raise ValueError(f"a label must be a finite number or a string, got {type(value).__name__}")


LabelValue = Annotated[
    Label,
    PlainValidator(_label),
    WithJsonSchema({"anyOf": [{"type": "number"}, {"type": "string", "maxLength": MAX_LABEL_CHARS}]}),
]


class FeedbackRecord(BaseModel):
    """The true labels of one served request: one label per row the request carried, in row order.

    `request_id`: the id the /predict answer returned. `ts`: when the client learned the truth (its
    clock, optional; kept, never trusted for ordering). The Tracker cannot check the row count here
    (the prediction may not be logged yet, or ever): a consumer joining the two does.
    """

    model_config = ConfigDict(extra="forbid")

    request_id: str = Field(min_length=1, max_length=200)
    labels: list[LabelValue] = Field(min_length=1, max_length=MAX_LABELS)
    ts: float | None = Field(None, ge=0, allow_inf_nan=False)


@dataclass(frozen=True)
class StoredFeedback:
    """One stored row: what a consumer paging with `since` gets."""

    seq: int
    request_id: str
    labels: list[Label]
    ts: float | None
    received_at: float  # this process's clock when the row was stored


@dataclass(frozen=True)
class FeedbackPage:
    """`records` in seq order; `next`: the seq to pass as `after_seq` next time (unchanged when empty)."""

    records: list[StoredFeedback]
    next: int


@dataclass(frozen=True)
class FeedbackStats:
    stored: int
    last_seq: int


_metadata = MetaData()
_feedback = Table(
    "feedback_records",
    _metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("request_id", String(200), nullable=False, unique=True),
    Column("labels", Text, nullable=False),  # JSON list, exactly as accepted
    Column("ts", Float, nullable=True),  # the client's
    Column("received_at", Float, nullable=False),  # ours
    sqlite_autoincrement=True,  # never reuse a seq
)


class FeedbackLog:
    """Durable, exactly-once, first-wins log of true labels by request_id in a SQL database.

    `url`: a SQLAlchemy URL (SQLite, WAL and synchronous=FULL, or PostgreSQL), e.g.
    Settings.store_url_for("tracker-feedback"); it may be the prediction log's database too (another
    table). Thread-safe: the router appends and reads from worker threads.
    """

    def __init__(self, url: str) -> None:
        self._serialise = serialise_appends(make_url(url).get_backend_name(), _PG_FEEDBACK_LOCK)
        self.url = url
        self.engine: Engine = create_engine(url, future=True)
        if self.engine.dialect.name == "sqlite":
            event.listen(self.engine, "connect", sqlite_pragmas)
        create_tables(_metadata, self.engine)

    def close(self) -> None:
        self.engine.dispose()

    def _insert(self) -> Any:
        if self.engine.dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            return pg_insert(_feedback).on_conflict_do_nothing()
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(_feedback).on_conflict_do_nothing()

    def append(self, records: Sequence[FeedbackRecord], now: float | None = None) -> AppendResult:
        """Store the records whose request_id is not stored yet, in one transaction. Blocking.

        Within one call, the first record of an id wins as well. `stored` counts new rows; the rest
        (re-sends and conflicting later labels alike) are duplicates, acknowledged and dropped.
        """
        if not records:
            return AppendResult(0, 0)
        received = time.time() if now is None else now
        rows = [
            {"request_id": r.request_id, "labels": json.dumps(r.labels), "ts": r.ts, "received_at": received}
            for r in records
        ]
        with self.engine.begin() as conn:
            if self._serialise is not None:  # seq order = commit order (module docstring, rule 3)
                conn.execute(self._serialise)
            if self.engine.dialect.name == "sqlite":  # sqlite3's executemany rowcount is the total
                stored = conn.execute(self._insert(), rows).rowcount
            else:
                count = select(func.count()).select_from(_feedback)
                before = conn.execute(count).scalar_one()
                conn.execute(self._insert(), rows)
                stored = conn.execute(count).scalar_one() - before
        return AppendResult(accepted=len(records), stored=int(stored))

    def since(self, after_seq: int = 0, limit: int = 1000) -> FeedbackPage:
        """The next `limit` (1..MAX_PAGE) rows with seq > `after_seq`, in seq order. Blocking."""
        if not 1 <= limit <= MAX_PAGE:
            raise ValueError(f"limit must be 1..{MAX_PAGE}, got {limit}")
        query = select(_feedback).where(_feedback.c.seq > after_seq).order_by(_feedback.c.seq).limit(limit)
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        records = [
            StoredFeedback(int(r.seq), str(r.request_id), json.loads(r.labels),
                           None if r.ts is None else float(r.ts), float(r.received_at))
            for r in rows
        ]
        return FeedbackPage(records, records[-1].seq if records else after_seq)

    def lookup(self, request_ids: Iterable[str]) -> dict[str, list[Label]]:
        """request_id -> labels for the ids that have feedback (missing ids are left out). Blocking.

        At most MAX_LOOKUP_IDS distinct ids per call (ValueError beyond), queried LOOKUP_CHUNK at a time.
        """
        ids = list(dict.fromkeys(request_ids))
        if len(ids) > MAX_LOOKUP_IDS:
            raise ValueError(f"{len(ids)} request ids in one lookup; at most {MAX_LOOKUP_IDS}")
        out: dict[str, list[Label]] = {}
        with self.engine.connect() as conn:
            for i in range(0, len(ids), LOOKUP_CHUNK):
                chunk = ids[i : i + LOOKUP_CHUNK]
                query = select(_feedback.c.request_id, _feedback.c.labels).where(_feedback.c.request_id.in_(chunk))
                for r in conn.execute(query):
                    out[str(r.request_id)] = json.loads(r.labels)
        return out

    def stats(self) -> FeedbackStats:
        """`stored`: rows held; `last_seq`: the highest seq drawn so far (0 when empty)."""
        with self.engine.connect() as conn:
            stored, last = conn.execute(
                select(func.count(), func.coalesce(func.max(_feedback.c.seq), 0)).select_from(_feedback)
            ).one()
        return FeedbackStats(stored=int(stored), last_seq=int(last))
