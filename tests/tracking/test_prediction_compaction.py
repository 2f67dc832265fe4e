"""Prediction log: flushed rows are compacted after the retention window (the dedup horizon), never
before it and never unflushed ones; appends on PostgreSQL serialise so seq order is commit order."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy.dialects import postgresql

from scanflow.tracking import predictions as P
from scanflow.tracking.predictions import PredictionLog, PredictionRecord, compaction_bound, read_since


def recs(record, ids) -> list[PredictionRecord]:  # type: ignore[no-untyped-def]
    return [PredictionRecord.model_validate(record(i)) for i in ids]


@pytest.mark.parametrize(
    ("covered", "min_wm", "oldest", "max_rows", "want"),
    [
        (0, 50, 1, 100, 0),  # no mark old enough: nothing
        (50, 50, 1, 100, 50),  # up to the old mark
        (50, 30, 1, 100, 30),  # another log on this DB is at 30: not beyond
        (50, 50, 1, 10, 10),  # bounded per call
        (50, 50, None, 100, 0),  # no rows left
        (50, 50, 51, 100, 0),  # already compacted up to 50
    ],
)
def test_compaction_bound(covered: int, min_wm: int, oldest: int | None, max_rows: int, want: int) -> None:
    assert compaction_bound(covered, min_wm, oldest, max_rows) == want


@pytest.mark.parametrize(
    ("newest", "wm", "now", "want"),
    [
        (None, 0, 100.0, False),  # nothing flushed yet
        (None, 5, 100.0, True),
        ((5, 99.0), 5, 200.0, False),  # watermark has not moved
        ((5, 99.0), 9, 100.0, False),  # moved, but a mark was written 1 s ago (every 36 s)
        ((5, 99.0), 9, 135.0, True),
    ],
)
def test_mark_due(newest: tuple[int, float] | None, wm: int, now: float, want: bool) -> None:
    assert P.mark_due(newest, wm, now, 36.0) == want


def test_appends_serialise_on_postgresql_and_other_databases_are_refused(tmp_path: Path) -> None:
    assert P.serialise_appends("sqlite") is None  # SQLite serialises writers by itself
    stmt = P.serialise_appends("postgresql")
    assert stmt is not None
    sql = str(stmt.compile(dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True}))
    assert sql == f"SELECT pg_advisory_xact_lock({P._PG_APPEND_LOCK}) AS pg_advisory_xact_lock_1"
    with pytest.raises(ValueError, match="'mysql' not supported"):
        PredictionLog("mysql://user@127.0.0.1/db")  # refused before any driver or connection
    with pytest.raises(ValueError, match="retention_s"):
        PredictionLog(f"sqlite:///{tmp_path / 'p.db'}", retention_s=0)


def test_compaction_keeps_the_dedup_window_and_never_touches_unflushed_rows(
    mlflow_server: str, tmp_path: Path, record, unique_name: str  # type: ignore[no-untyped-def]
) -> None:
    log = PredictionLog(f"sqlite:///{tmp_path / 'p.db'}", retention_s=3600.0)
    log.append(recs(record, range(30)))
    res = log.flush_to_mlflow(unique_name, batch_size=10)
    assert res.watermark == 30
    log.append(recs(record, range(30, 35)))  # pending: never compacted, whatever its age
    assert log.compact(now=time.time()) == 0  # inside the window: kept
    assert log.append(recs(record, range(30))).duplicates == 30  # and still deduplicated

    later = time.time() + 3600.0 + 1.0
    assert log.compact(now=later, max_rows=25) == 25  # bounded per call
    assert log.compact(now=later) == 5
    st = log.stats()
    assert (st.stored, st.pending, st.watermark, st.last_seq) == (5, 5, 30, 35)

    # past the horizon a re-send is a new record (documented): stored again, with a new seq
    assert log.append(recs(record, [0])).stored == 1
    res = log.flush_to_mlflow(unique_name)
    assert res.records == 6 and res.watermark == log.stats().last_seq  # seqs may have gaps, never go back
    got = read_since(res.run_id, 30)  # exactly once in seq order after the compaction
    assert [r.request_id for r in got.records] == [f"req-{i:06d}" for i in [*range(30, 35), 0]]
    assert got.seqs == sorted(got.seqs) and got.seqs[0] > 30 and got.watermark == res.watermark


def test_the_flush_path_compacts(mlflow_server: str, tmp_path: Path, record, unique_name: str) -> None:  # type: ignore[no-untyped-def]
    retention = 0.2
    log = PredictionLog(f"sqlite:///{tmp_path / 'p.db'}", retention_s=retention)
    log.append(recs(record, range(8)))
    log.flush_to_mlflow(unique_name)
    flushed_by = time.time()  # the flush mark was taken before this
    assert log.stats().stored == 8  # just flushed: inside the window
    deadline = flushed_by + retention
    while time.time() <= deadline:  # a clock condition, not a sleep standing in for one
        time.sleep(0.01)
    log.flush_to_mlflow(unique_name)  # nothing to flush, but it compacts
    assert log.stats().stored == 0 and log.watermark == 8


def test_batches_keep_the_correlation_fields(tmp_path: Path) -> None:
    """The client's own id and the replica that answered survive the trip to Parquet (what is read
    from MLflow once the database rows are compacted away); a batch without the columns reads None."""
    import io

    import pyarrow.parquet as pq

    base = {"service": "s", "inputs": [[0.5]], "outputs": [1], "model_version": "2", "latency_ms": 1.0}
    recs_ = [PredictionRecord(request_id="r1", ts=1.0, client_request_id="order-17", replica_id="s-0", **base),
             PredictionRecord(request_id="r2", ts=2.0, **base)]
    data = P.to_parquet([(i, r.model_dump_json()) for i, r in enumerate(recs_)])
    path = tmp_path / "batch.parquet"
    path.write_bytes(data)
    got = [r for _, r in P.from_parquet(path)]
    assert [(r.client_request_id, r.replica_id) for r in got] == [("order-17", "s-0"), (None, None)]
    pq.write_table(pq.read_table(io.BytesIO(data)).drop_columns(["client_request_id", "replica_id"]), path)
    assert [r.client_request_id for _, r in P.from_parquet(path)] == [None, None]  # an older batch


def test_each_flush_leaves_a_preview_the_mlflow_ui_can_show(
    mlflow_server: str, tmp_path: Path, record, unique_name: str  # type: ignore[no-untyped-def]
) -> None:
    """Beside the Parquet batches (which the UI cannot preview), a CSV of the newest batch; readers of
    the log ignore it."""
    from mlflow import MlflowClient

    log = PredictionLog(f"sqlite:///{tmp_path / 'p.db'}")
    log.append(recs(record, range(25)))
    res = log.flush_to_mlflow(unique_name, batch_size=10)
    assert res.batches == 3
    path = MlflowClient().download_artifacts(res.run_id, f"{P.ARTIFACT_DIR}/{P.PREVIEW_NAME}", str(tmp_path))
    lines = Path(path).read_text().splitlines()
    assert lines[0].startswith("seq,time_utc,request_id,service,model_version,latency_ms")
    assert [int(line.split(",")[0]) for line in lines[1:]] == list(range(21, 26))  # the newest batch: seqs 21-25
    assert len(read_since(res.run_id, 0)) == 25  # the preview is not read as a batch


def test_the_preview_is_bounded_and_shows_the_input_width() -> None:
    body = PredictionRecord(request_id="r", service="s", inputs=[[0.5] * 64], outputs=[3], model_version="2",
                            latency_ms=1.25, ts=0.0).model_dump_json()
    text = P.preview_csv([(i, body) for i in range(1, 200)], limit=50)
    rows = text.splitlines()
    assert len(rows) == 51 and rows[1].endswith(",64") and "0.5 0.5" in rows[1]
