"""Prediction log: de-duplication, flush to a real MLflow server, crash between upload and commit."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from mlflow import MlflowClient

from scanflow.tracking import predictions as P
from scanflow.tracking.predictions import PredictionLog, PredictionRecord, batches_to_read, read_since


def recs(record, ids) -> list[PredictionRecord]:  # type: ignore[no-untyped-def]
    return [PredictionRecord.model_validate(record(i, labels=True)) for i in ids]


def stored_rows(run_id: str, tmp: Path) -> list[str]:
    """Every request_id in every batch file of the run, duplicates included (what MLflow really holds)."""
    client = MlflowClient()
    ids: list[str] = []
    for f in client.list_artifacts(run_id, P.ARTIFACT_DIR):
        local = client.download_artifacts(run_id, f.path, str(tmp))
        ids += pq.read_table(local).column("request_id").to_pylist()
    return ids


@pytest.mark.parametrize(
    ("firsts", "wm", "want"),
    [
        ([], 0, []),
        ([1, 51, 101], 0, [1, 51, 101]),
        ([1, 51, 101], 50, [1, 51, 101]),  # the batch holding the watermark may have grown: re-read
        ([1, 51, 101], 51, [51, 101]),
        ([101, 1, 51], 500, [101]),
    ],
)
def test_batches_to_read(firsts: list[int], wm: int, want: list[int]) -> None:
    assert batches_to_read(firsts, wm) == want


def test_append_is_idempotent_by_request_id(tmp_path: Path, record) -> None:  # type: ignore[no-untyped-def]
    log = PredictionLog(f"sqlite:///{tmp_path / 'p.db'}")
    first = log.append(recs(record, range(10)))
    again = log.append(recs(record, range(5, 15)))
    assert (first.accepted, first.stored) == (10, 10)
    assert (again.accepted, again.stored, again.duplicates) == (10, 5, 5)
    reopened = PredictionLog(f"sqlite:///{tmp_path / 'p.db'}")  # durable across a new process/handle
    assert reopened.stats().stored == 15 and reopened.stats().pending == 15


def test_log_name_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="log name"):
        PredictionLog(f"sqlite:///{tmp_path / 'p.db'}", name="x' or '1'='1")


def test_record_validation() -> None:
    with pytest.raises(ValueError, match="same non-zero width"):
        PredictionRecord(
            request_id="a", service="s", inputs=[[1.0], [1.0, 2.0]], outputs=[], model_version="1",
            latency_ms=1, ts=1,
        )  # fmt: skip
    with pytest.raises(ValueError):
        PredictionRecord(
            request_id="", service="s", inputs=[[1.0]], outputs=[], model_version="1", latency_ms=1, ts=1
        )


def test_flush_and_read_since(mlflow_server: str, tmp_path: Path, record, unique_name: str) -> None:  # type: ignore[no-untyped-def]
    log = PredictionLog(f"sqlite:///{tmp_path / 'p.db'}")
    log.append(recs(record, range(25)))
    res = log.flush_to_mlflow(unique_name, batch_size=10)
    assert (res.batches, res.records, res.watermark) == (3, 25, 25)
    assert res.artifacts[0] == "predictions/batch-000000000001.parquet"
    assert P.prediction_run_id(unique_name) == res.run_id
    assert log.flush_to_mlflow(unique_name).batches == 0  # nothing pending: nothing written

    got = read_since(res.run_id, 0)
    assert [r.request_id for r in got.records] == [f"req-{i:06d}" for i in range(25)]
    assert got.inputs().shape == (25, 64) and got.labels() == [i % 10 for i in range(25)]
    assert got.watermark == 25
    log.append(recs(record, range(25, 30)))
    log.flush_to_mlflow(unique_name, batch_size=10)
    more = read_since(res.run_id, got.watermark)
    assert [r.request_id for r in more.records] == [f"req-{i:06d}" for i in range(25, 30)]
    metrics = MlflowClient().get_metric_history(res.run_id, "predictions_flushed_total")
    assert max(m.value for m in metrics) == 30


def test_crash_between_upload_and_commit_neither_loses_nor_duplicates(
    mlflow_server: str, tmp_path: Path, record, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    log = PredictionLog(f"sqlite:///{tmp_path / 'p.db'}")
    log.append(recs(record, range(12)))
    log.flush_to_mlflow(unique_name, batch_size=5, max_batches=1)  # seq 1-5 committed
    run_id = log.stats().run_id
    assert run_id

    real_commit = log._commit_watermark

    def die(*_a: object) -> None:
        raise KeyboardInterrupt("simulated SIGKILL after upload, before the watermark commit")

    monkeypatch.setattr(log, "_commit_watermark", die)
    with pytest.raises(KeyboardInterrupt):
        log.flush_to_mlflow(unique_name, batch_size=5)  # uploads batch 6-10, "dies"
    assert log.watermark == 5
    # a consumer read the uncommitted batch in the meantime
    consumer = read_since(run_id, 0)
    assert len(consumer) == 10

    monkeypatch.setattr(log, "_commit_watermark", real_commit)
    log.append(recs(record, range(12, 20)))
    log.flush_to_mlflow(unique_name, batch_size=8)  # different batch size: overwrites batch-6 with 6-13
    assert log.watermark == 20

    ids = stored_rows(run_id, tmp_path)
    assert sorted(ids) == [f"req-{i:06d}" for i in range(20)]  # each exactly once in MLflow
    rest = read_since(run_id, consumer.watermark)
    assert [r.request_id for r in rest.records] == [f"req-{i:06d}" for i in range(10, 20)]


def test_flush_takes_what_was_stored_when_it_started(
    mlflow_server: str, tmp_path: Path, record, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """Appends racing a flush wait for the next call, so a Tracker's periodic flush always returns."""
    log = PredictionLog(f"sqlite:///{tmp_path / 'p.db'}")
    log.append(recs(record, range(6)))
    real_commit = log._commit_watermark
    extra = iter(range(100, 200))

    def commit_and_append(old: int, new: int, flushed: int) -> None:
        real_commit(old, new, flushed)
        log.append(recs(record, [next(extra)]))  # a new record lands during every batch

    monkeypatch.setattr(log, "_commit_watermark", commit_and_append)
    res = log.flush_to_mlflow(unique_name, batch_size=2)
    assert (res.batches, res.records) == (3, 6)
    assert log.stats().pending == 3
