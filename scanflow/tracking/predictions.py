"""Exactly-once prediction logging: a durable local log, flushed to MLflow in crash-safe batches.

Who calls it: the Tracker agent (through `scanflow.tracking.api.predictions_router`, which appends what
the gateway and replicas POST, and a periodic `flush_to_mlflow`), and the Checker (`read_since`, to
get the inputs of new predictions as arrays for drift detection).

How "exactly once" holds (docs/tracking.md explains it at length):
1. Append: one SQLite (WAL, synchronous=FULL) row per `request_id`, inserted with ON CONFLICT DO
   NOTHING. A client that re-sends after a lost reply is acknowledged again but stored once. Each row
   gets a monotonically increasing `seq`, and seq order must be commit order (else a reader at a
   watermark could skip a lower seq committed after a higher one): SQLite serialises writers by
   itself; on PostgreSQL every append first takes a transaction-scoped advisory lock
   (`pg_advisory_xact_lock`), so appends take their seqs and commit one after another. Other
   databases are refused.
2. Flush: the pending rows are those with seq > watermark. A batch takes the next rows in seq order and
   is written as `predictions/<shard>/<shard>/<shard>/batch-<first seq>.parquet` in the log's MLflow run
   (the shards are prefixes of the 12-digit first seq, `shard_dirs`: a path fixed by the first seq
   alone, and no directory holds more than 1,000 entries); only after the upload
   does the watermark advance (a compare-and-set in the same DB). A SIGKILL between upload and commit
   leaves the watermark where it was, so the re-flush starts at the same first seq, produces the same
   artifact path and overwrites that file: nothing is lost, nothing is stored twice. At most one
   uncommitted artifact exists at any moment (always the one at watermark + 1).
3. Read: `read_since(run_id, watermark)` returns rows with seq > watermark. It re-reads the batch that
   contains the caller's watermark (the only one that may have been overwritten with more rows since)
   and every later batch, and filters by seq, so a consumer never misses or repeats a row. It lists the
   root and, per shard level, only the shard holding the watermark and later ones (plus the previous
   shard when the batch holding the watermark began there), so a caught-up consumer's cost does not
   grow with the run's history, and downloads only the batches it needs. Runs written before shards
   (flat `predictions/batch-*.parquet`) are read as well, alone or mixed with sharded batches.
4. Compaction: rows are also the dedup record of their `request_id`, so flushed rows are kept for a
   retention window (`retention_s`, default 1 hour: the dedup horizon) and deleted after it, by the
   flush path, in bounded chunks. A re-send later than that after its first flush is stored again.
   The window is measured on this process's clock from when a row was known to be flushed (a "flush
   mark": watermark + time, recorded after each flush), never from the client's `ts`.

The parts: the records and results (prediction_records), where batches live in the run
(prediction_layout), their Parquet bytes (prediction_parquet) and the consumers' read (prediction_reader);
this module is the log itself. It re-exports the names its callers used before the split.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Column,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    delete,
    event,
    func,
    select,
    update,
)
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.sql import Executable

from scanflow.sqlschema import create_tables
from scanflow.tracking.prediction_layout import (
    ARTIFACT_DIR,
    LOG_NAME_RE,
    RUN_TAG,
    SEQ_DIGITS,
    SHARD_DIGITS,
    Lister,
    all_batch_artifacts,
    batch_artifact_name,
    batch_artifact_path,
    batches_to_read,
    first_seq_of,
    locate_batches,
    mlflow_lister,
    run_artifact_repo,
    shard_dirs,
    shard_plan,
    shard_start,
)
from scanflow.tracking.prediction_parquet import PREVIEW_NAME, from_parquet, preview_csv, to_parquet
from scanflow.tracking.prediction_reader import prediction_run_id, read_since
from scanflow.tracking.prediction_records import (
    AppendResult,
    FlushResult,
    LogStats,
    PredictionBatch,
    PredictionRecord,
)

__all__ = [  # what callers import from here (the log, and the names from before the split)
    "ARTIFACT_DIR", "DEFAULT_RETENTION_S", "PREVIEW_NAME", "RUN_TAG", "SEQ_DIGITS", "SHARD_DIGITS", "AppendResult",
    "FlushResult", "Lister", "LogStats", "PredictionBatch", "PredictionLog", "PredictionRecord", "all_batch_artifacts",
    "batch_artifact_name", "batch_artifact_path", "batches_to_read", "compaction_bound", "first_seq_of",
    "from_parquet", "locate_batches", "mark_due", "mlflow_lister", "prediction_run_id", "preview_csv", "read_since",
    "run_artifact_repo", "serialise_appends", "shard_dirs", "shard_plan", "shard_start", "sqlite_pragmas",
    "to_parquet",
]

log = logging.getLogger(__name__)

DEFAULT_RETENTION_S = 3600.0  # flushed rows kept this long: the request_id dedup horizon
COMPACT_CHUNK = 2_000  # rows deleted per transaction (appends wait on the write lock only this long)
COMPACT_MAX_ROWS = 50_000  # rows deleted per flush call at most (the rest at the next flush)
MARKS_PER_WINDOW = 100  # flush marks written per retention window at most (compaction's time resolution)
DIALECTS = ("sqlite", "postgresql")  # where seq order is made commit order (see append)
# pg_advisory_xact_lock key serialising appends (any fixed int64; "scanflow" in ASCII)
_PG_APPEND_LOCK = 0x7363616E666C6F77


_metadata = MetaData()
_records = Table(
    "prediction_records",
    _metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("request_id", String(200), nullable=False, unique=True),
    Column("service", String(200), nullable=False),
    Column("ts", Float, nullable=False),
    Column("body", Text, nullable=False),  # the record as JSON, exactly as accepted
    sqlite_autoincrement=True,  # never reuse a seq, even after deletes
)
_state = Table(
    "prediction_flush_state",
    _metadata,
    Column("name", String(200), primary_key=True),
    Column("run_id", String(64), nullable=True),
    Column("watermark", Integer, nullable=False, default=0),
    Column("flushed", Integer, nullable=False, default=0),  # records written up to the watermark
    Column("log_id", String(64), nullable=False),
)
_marks = Table(  # "by time `at`, rows up to `watermark` were flushed": what compaction goes by
    "prediction_flush_marks",
    _metadata,
    Column("name", String(200), primary_key=True),
    Column("watermark", Integer, primary_key=True),
    Column("at", Float, nullable=False),  # wall clock (time.time()): it must survive restarts
)


def serialise_appends(dialect: str, lock_key: int = _PG_APPEND_LOCK) -> Executable | None:
    """The statement an append runs first so that seq order is commit order, or None if the
    database already serialises writers (SQLite). Pure, so the PostgreSQL SQL is tested without a
    server. The advisory lock is held until the append's transaction ends: a second appender waits
    for it before drawing seqs, so it draws higher ones and commits later. `lock_key`: one per table
    (the feedback log passes its own), so two logs on one database do not wait on each other."""
    if dialect == "sqlite":
        return None
    if dialect == "postgresql":
        return select(func.pg_advisory_xact_lock(lock_key))
    raise ValueError(f"prediction log: database {dialect!r} not supported (use one of {', '.join(DIALECTS)})")


def mark_due(newest: tuple[int, float] | None, watermark: int, now: float, every_s: float) -> bool:
    """Whether to write a flush mark (`watermark` flushed as of `now`). Pure. At most one per
    `every_s` (so a 1 s flush loop keeps ~100 marks per window, not 3,600), and only when the
    watermark moved past the newest mark. Every flush call asks, so rows flushed just after a mark are
    covered by a later one even when traffic stops."""
    if newest is None:
        return watermark > 0
    return watermark > newest[0] and now - newest[1] >= every_s


def compaction_bound(covered: int, min_watermark: int, oldest_seq: int | None, max_rows: int) -> int:
    """The highest seq compaction may delete now (0: nothing). Pure.

    `covered`: the highest watermark of this log's flush marks at least `retention_s` old (every row
    up to it was flushed, hence appended, before the window began). Never above `min_watermark`
    (the lowest watermark of any log on this database: they share the rows), and at most `max_rows`
    seqs past the oldest row still stored (seqs have gaps, so at most that many rows).
    """
    bound = min(covered, min_watermark)
    if oldest_seq is None or bound < oldest_seq:
        return 0
    return min(bound, oldest_seq + max_rows - 1)


def sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    """Connect hook of every SQLite engine holding an exactly-once log (this one, the feedback log)."""
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=FULL")  # an acknowledged record survives a power cut too
    cur.execute("PRAGMA busy_timeout=10000")
    cur.close()


class PredictionLog:
    """Durable, de-duplicating log of predictions in a SQL database, flushed to one MLflow run.

    `url`: a SQLAlchemy URL (e.g. Settings.store_url_for("tracker")). `name`: identifies this log's
    MLflow run (tag `scanflow.predictions=<name>`), so a restarted Tracker keeps writing the same run.
    Thread-safe: the API appends from worker threads while a flush runs in another.
    """

    def __init__(self, url: str, *, name: str = "default", retention_s: float = DEFAULT_RETENTION_S) -> None:
        if not LOG_NAME_RE.fullmatch(name):
            raise ValueError(f"log name {name!r}: use 1-100 letters, digits, '.', '_' or '-'")
        if not retention_s > 0:
            raise ValueError(f"retention_s must be > 0 (the request_id dedup horizon), got {retention_s}")
        self._serialise = serialise_appends(make_url(url).get_backend_name())  # refuses others early
        self.url = url
        self.name = name
        self.retention_s = float(retention_s)
        self.engine: Engine = create_engine(url, future=True)
        if self.engine.dialect.name == "sqlite":
            event.listen(self.engine, "connect", sqlite_pragmas)
        create_tables(_metadata, self.engine)
        self._flush_lock = threading.Lock()
        with self.engine.begin() as conn:
            if conn.execute(select(_state.c.name).where(_state.c.name == name)).first() is None:
                conn.execute(
                    self._insert(_state).values(
                        name=name, run_id=None, watermark=0, flushed=0, log_id=uuid.uuid4().hex
                    )
                )

    def _insert(self, table: Table) -> Any:
        if self.engine.dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            return pg_insert(table).on_conflict_do_nothing()
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(table).on_conflict_do_nothing()

    def close(self) -> None:
        self.engine.dispose()

    # --- append --------------------------------------------------------------------------------

    def append(self, records: Sequence[PredictionRecord]) -> AppendResult:
        """Store the records not stored yet (by request_id), in one transaction. Blocking."""
        if not records:
            return AppendResult(0, 0)
        rows = [
            {
                "request_id": r.request_id,
                "service": r.service,
                "ts": r.ts,
                "body": r.model_dump_json(),
            }
            for r in records
        ]
        with self.engine.begin() as conn:
            if self._serialise is not None:  # seq order = commit order (module docstring, step 1)
                conn.execute(self._serialise)
            if self.engine.dialect.name == "sqlite":  # sqlite3's executemany rowcount is the total
                stored = conn.execute(self._insert(_records), rows).rowcount
            else:
                count = select(func.count()).select_from(_records)
                before = conn.execute(count).scalar_one()
                conn.execute(self._insert(_records), rows)
                stored = conn.execute(count).scalar_one() - before
            conflicts = self._conflicts(conn, rows) if stored < len(rows) else 0
        if conflicts:
            log.warning("%d prediction record(s) re-sent with a different body than the one stored under "
                        "their request_id: the first is kept", conflicts)
        return AppendResult(accepted=len(records), stored=int(stored), conflicts=conflicts)

    @staticmethod
    def _conflicts(conn: Any, rows: list[dict[str, Any]]) -> int:
        """How many of `rows` differ from the body stored under their request_id (after the insert:
        the newly stored ones match themselves). Only run when some rows were duplicates."""
        stored = dict(conn.execute(select(_records.c.request_id, _records.c.body).where(
            _records.c.request_id.in_({r["request_id"] for r in rows}))).all())
        return sum(1 for r in rows if r["request_id"] in stored and stored[r["request_id"]] != r["body"])

    # --- state ---------------------------------------------------------------------------------

    def _load_state(self) -> tuple[str | None, int, str]:
        row = self._state_row()
        return row.run_id, int(row.watermark), str(row.log_id)

    def _state_row(self) -> Any:
        with self.engine.connect() as conn:
            return conn.execute(select(_state).where(_state.c.name == self.name)).one()

    @property
    def watermark(self) -> int:
        return self._load_state()[1]

    @property
    def run_id(self) -> str | None:
        """The MLflow run this log flushes into, once the first flush created or found it."""
        return self._load_state()[0]

    def stats(self) -> LogStats:
        """`stored`: rows held locally now (compaction removes old flushed ones); `last_seq` never
        goes back, even when every row was compacted away."""
        run_id, wm, _ = self._load_state()
        with self.engine.connect() as conn:
            stored, last = conn.execute(
                select(func.count(), func.coalesce(func.max(_records.c.seq), 0)).select_from(_records)
            ).one()
            pending = conn.execute(
                select(func.count()).select_from(_records).where(_records.c.seq > wm)
            ).scalar_one()
        return LogStats(
            stored=int(stored), last_seq=max(int(last), wm), watermark=wm, pending=int(pending), run_id=run_id
        )

    def pending(self, limit: int, after: int | None = None, upto: int | None = None) -> list[tuple[int, str]]:
        """The next `limit` (seq, body) rows after `after` (default: the watermark), in seq order,
        with seq <= `upto` when given."""
        wm = self.watermark if after is None else after
        query = select(_records.c.seq, _records.c.body).where(_records.c.seq > wm)
        if upto is not None:
            query = query.where(_records.c.seq <= upto)
        with self.engine.connect() as conn:
            rows = conn.execute(query.order_by(_records.c.seq).limit(limit)).all()
        return [(int(r.seq), str(r.body)) for r in rows]

    def stats_last_seq(self) -> int:
        """The highest seq stored so far (0 when empty)."""
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.coalesce(func.max(_records.c.seq), 0))).scalar_one())

    def _commit_watermark(self, old: int, new: int, flushed: int) -> None:
        """Compare-and-set: a concurrent flusher that already advanced it makes this a no-op."""
        with self.engine.begin() as conn:
            conn.execute(
                update(_state)
                .where(_state.c.name == self.name, _state.c.watermark == old)
                .values(watermark=new, flushed=flushed)
            )

    # --- compaction ----------------------------------------------------------------------------

    def _mark_flushed(self, now: float) -> None:
        """Record, when due (`mark_due`), that rows up to the current watermark are flushed as of `now`."""
        with self.engine.connect() as conn:
            wm = int(conn.execute(select(_state.c.watermark).where(_state.c.name == self.name)).scalar_one())
            row = conn.execute(
                select(_marks.c.watermark, _marks.c.at).where(_marks.c.name == self.name)
                .order_by(_marks.c.watermark.desc()).limit(1)
            ).first()
        newest = None if row is None else (int(row.watermark), float(row.at))
        if mark_due(newest, wm, now, self.retention_s / MARKS_PER_WINDOW):
            with self.engine.begin() as conn:
                conn.execute(self._insert(_marks).values(name=self.name, watermark=wm, at=now))

    def compact(self, now: float | None = None, max_rows: int = COMPACT_MAX_ROWS) -> int:
        """Delete flushed rows older than the retention window (the dedup horizon), at most
        `max_rows`, in transactions of COMPACT_CHUNK rows, and the flush marks no longer needed.
        Returns the rows deleted. The flush path calls it; with nothing to do it costs four indexed
        reads and no write transaction. Rows above any log's watermark are never touched."""
        now = time.time() if now is None else now
        mine = _marks.c.name == self.name
        with self.engine.connect() as conn:
            covered, lowest_mark = conn.execute(
                select(func.max(_marks.c.watermark).filter(_marks.c.at <= now - self.retention_s),
                       func.min(_marks.c.watermark)).where(mine)
            ).one()
            min_wm = conn.execute(select(func.min(_state.c.watermark))).scalar_one()
            oldest = conn.execute(select(func.min(_records.c.seq))).scalar_one()
        covered = int(covered or 0)
        if covered and lowest_mark is not None and int(lowest_mark) < covered:  # superseded by `covered`
            with self.engine.begin() as conn:
                conn.execute(delete(_marks).where(mine, _marks.c.watermark < covered))
        bound = compaction_bound(covered, int(min_wm or 0), None if oldest is None else int(oldest), max_rows)
        deleted = 0
        low = int(oldest or 0)
        while bound and low <= bound:
            high = min(bound, low + COMPACT_CHUNK - 1)
            with self.engine.begin() as conn:
                deleted += self._delete_upto(conn, high)
            low = high + 1
        if deleted:
            log.info("prediction log %s: compacted %d flushed rows up to seq %d", self.name, deleted, bound)
        return deleted

    @staticmethod
    def _delete_upto(conn: Connection, seq: int) -> int:
        return int(conn.execute(delete(_records).where(_records.c.seq <= seq)).rowcount or 0)

    # --- flush ---------------------------------------------------------------------------------

    def ensure_run(self, experiment: str) -> str:
        """This log's MLflow run in `experiment`: remembered in the DB, else found by tag, else created.

        The tag search makes a crash between creating the run and remembering it harmless (the next
        call finds the same run instead of opening a second one).
        """
        from mlflow import MlflowClient

        from scanflow.tracking.registry import ensure_experiment

        run_id, _, log_id = self._load_state()
        if run_id:
            return run_id
        client = MlflowClient()
        exp_id = ensure_experiment(experiment)
        found = client.search_runs(
            [exp_id],
            filter_string=f"tags.`{RUN_TAG}` = '{self.name}' and tags.`scanflow.log_id` = '{log_id}'",
            max_results=1,
        )
        if found:
            run_id = found[0].info.run_id
        else:
            run = client.create_run(
                exp_id,
                run_name=f"predictions-{self.name}",
                tags={RUN_TAG: self.name, "scanflow.log_id": log_id, "scanflow.kind": "predictions"},
            )
            run_id = run.info.run_id
        with self.engine.begin() as conn:
            conn.execute(update(_state).where(_state.c.name == self.name).values(run_id=run_id))
        return str(run_id)

    def flush_to_mlflow(
        self,
        experiment: str | None = None,
        *,
        run_id: str | None = None,
        batch_size: int = 1000,
        max_batches: int | None = None,
    ) -> FlushResult:
        """Write pending records to MLflow as Parquet batches, then advance the watermark. Blocking.

        Give `experiment` (the workflow's; this log's run is found or created there) or an explicit
        `run_id`. Safe to call again after a crash at any point; concurrent calls in one process are
        serialised. Flushes the records stored when the call starts (later ones wait for the next
        call), so it returns even while appends keep coming. Returns what was written by this call.
        """
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if run_id is None:
            if experiment is None:
                known, _, _ = self._load_state()
                if known is None:
                    raise ValueError("flush_to_mlflow needs an experiment (or run_id) the first time")
                run_id = known
            else:
                run_id = self.ensure_run(experiment)
        from mlflow import MlflowClient
        from mlflow.entities import Metric

        client = MlflowClient()
        batches = 0
        total = 0
        names: list[str] = []
        latest: list[tuple[int, str]] = []
        with self._flush_lock:
            # flush what is stored now, not what keeps arriving: the call returns even under load
            upto = self.stats_last_seq()
            while max_batches is None or batches < max_batches:
                state = self._state_row()
                wm, flushed = int(state.watermark), int(state.flushed)
                rows = self.pending(batch_size, after=wm, upto=upto)
                if not rows:
                    break
                first, last = rows[0][0], rows[-1][0]
                artifact = batch_artifact_path(first)
                with tempfile.TemporaryDirectory(prefix="scanflow-flush-") as tmp:
                    path = Path(tmp) / batch_artifact_name(first)
                    path.write_bytes(to_parquet(rows))
                    client.log_artifact(run_id, str(path), artifact.rsplit("/", 1)[0])
                now_ms = int(time.time() * 1000)
                flushed += len(rows)
                client.log_batch(
                    run_id,
                    metrics=[
                        Metric("predictions_flushed_total", float(flushed), now_ms, last),
                        Metric("predictions_batch_records", float(len(rows)), now_ms, last),
                    ],
                )
                self._commit_watermark(wm, last, flushed)
                batches += 1
                total += len(rows)
                names.append(artifact)
                latest = rows
            if batches:
                # Parquet three shard levels deep is not something the MLflow UI can show: a small CSV of
                # the newest batch, overwritten at each flush, is (best effort: the batches are written)
                with tempfile.TemporaryDirectory(prefix="scanflow-preview-") as tmp:
                    path = Path(tmp) / PREVIEW_NAME
                    path.write_text(preview_csv(latest))
                    try:
                        client.log_artifact(run_id, str(path), ARTIFACT_DIR)
                    except Exception as exc:  # noqa: BLE001 - the preview is a convenience, never a failure
                        log.warning("prediction preview not written: %s", exc)
            self._mark_flushed(time.time())
            self.compact()
        return FlushResult(
            run_id=run_id, batches=batches, records=total, watermark=self.watermark, artifacts=tuple(names)
        )
