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
    for path in P.all_batch_artifacts(P.mlflow_lister(run_id)):
        local = client.download_artifacts(run_id, path, str(tmp))
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
    assert res.artifacts[0] == "predictions/000/000000/000000000/batch-000000000001.parquet"
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


# --- sharded artifact layout ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "want"),
    [
        (1, "predictions/000/000000/000000000/batch-000000000001.parquet"),
        (999, "predictions/000/000000/000000000/batch-000000000999.parquet"),
        (1000, "predictions/000/000000/000000001/batch-000000001000.parquet"),  # first seq of the next shard
        (999_999, "predictions/000/000000/000000999/batch-000000999999.parquet"),
        (1_000_000, "predictions/000/000001/000001000/batch-000001000000.parquet"),
        (999_999_999_999, "predictions/999/999999/999999999/batch-999999999999.parquet"),
        (1_234_567, "predictions/000/000001/000001234/batch-000001234567.parquet"),
    ],
)
def test_batch_artifact_path(first: int, want: str) -> None:
    assert P.batch_artifact_path(first) == want
    # a shard name is read back as the first seq it may hold
    *_, lvl0, lvl1, lvl2, _ = want.split("/")
    assert P.shard_start(lvl0, 3) == first // 10**9 * 10**9
    assert P.shard_start(lvl1, 6) == first // 10**6 * 10**6
    assert P.shard_start(lvl2, 9) == first // 1000 * 1000


def test_shard_start_ignores_other_names() -> None:
    assert P.shard_start("tmp", 6) is None and P.shard_start("", 6) is None and P.shard_start("-1", 6) is None


@pytest.mark.parametrize(
    ("starts", "wm", "now", "fallback"),
    [
        ([], 5, [], []),
        ([0, 1000, 2000], 0, [0, 1000, 2000], []),
        ([0, 1000, 2000], 999, [0, 1000, 2000], []),  # last seq of shard 0
        ([0, 1000, 2000], 1000, [1000, 2000], [0]),  # exactly at a shard edge: shard 0 only as fallback
        ([2000, 0, 1000], 1500, [1000, 2000], [0]),
        ([0, 1000, 3000], 2500, [1000, 3000], [0]),  # watermark in a gap between shards
        ([1000, 2000], 500, [1000, 2000], []),  # before every shard
        ([0, 1000, 2000], 9999, [2000], [1000, 0]),  # fallback nearest first
    ],
)
def test_shard_plan(starts: list[int], wm: int, now: list[int], fallback: list[int]) -> None:
    assert P.shard_plan(starts, wm) == (now, fallback)


class FakeArtifacts:
    """An in-memory artifact tree (path -> entries) that counts listings and entries listed."""

    def __init__(self, paths: list[str]) -> None:
        self.tree: dict[str, dict[str, bool]] = {}
        for path in paths:
            parts = path.split("/")
            for i in range(1, len(parts)):
                self.tree.setdefault("/".join(parts[:i]), {})["/".join(parts[: i + 1])] = i < len(parts) - 1
        self.listings = 0
        self.entries = 0

    def __call__(self, path: str) -> list[tuple[str, bool]]:
        self.listings += 1
        got = sorted(self.tree.get(path, {}).items())
        self.entries += len(got)
        return got


def flat(first: int) -> str:
    return f"{P.ARTIFACT_DIR}/{P.batch_artifact_name(first)}"


def firsts_of(sizes: list[int]) -> list[int]:
    out, seq = [], 1
    for n in sizes:
        out.append(seq)
        seq += n
    return out


@pytest.mark.parametrize("digits", [(3, 6, 9), (10, 11), (9, 11), (11,)])
@pytest.mark.parametrize("sizes", [[7] * 9, [3, 25, 1, 1, 12, 40, 2], [10] * 6, [100], [95, 10, 3]])
def test_locate_batches_matches_the_flat_rule_at_every_watermark(digits: tuple[int, ...], sizes: list[int]) -> None:
    """Sharded or not, a consumer gets exactly the batches the flat rule names: batches straddling shard
    edges (size 25 over 10-seq shards, 100 over 100-seq ones, 96-105 over a level-1 edge) and watermarks on every edge included."""
    firsts = firsts_of(sizes)
    fake = FakeArtifacts([P.batch_artifact_path(f, digits) for f in firsts])
    for wm in range(sum(sizes) + 2):
        got = P.locate_batches(fake, wm, digits=digits)
        assert sorted(got) == batches_to_read(firsts, wm), wm
        assert got == {f: P.batch_artifact_path(f, digits) for f in got}


def test_locate_batches_straddling_batch_is_found_in_the_previous_shard() -> None:
    # batch 995 holds seqs 995-1004; the watermark 1002 is in shard 1000, whose only batch starts at 1005
    fake = FakeArtifacts([P.batch_artifact_path(s) for s in (985, 995, 1005, 1015)])
    assert sorted(P.locate_batches(fake, 1002)) == [995, 1005, 1015]
    fake.listings = 0
    assert sorted(P.locate_batches(fake, 1000)) == [995, 1005, 1015]  # exactly at the edge
    assert fake.listings == 5  # root, 000, 000000, 000000001, then 000000000 for the straddling batch
    fake.listings = 0
    assert sorted(P.locate_batches(fake, 1005)) == [1005, 1015]  # batch starts on the watermark
    assert fake.listings == 4  # the previous shard is not listed


def test_locate_batches_reads_the_flat_layout_and_a_mixed_one() -> None:
    old = [1, 11, 21]
    only_flat = FakeArtifacts([flat(s) for s in old])
    for wm in range(32):
        assert sorted(P.locate_batches(only_flat, wm)) == batches_to_read(old, wm)
    # upgraded run: flat history, then sharded; 21 was uploaded flat, not committed, re-flushed sharded
    mixed = FakeArtifacts([*(flat(s) for s in old), *(P.batch_artifact_path(s) for s in (21, 31, 41))])
    for wm in range(52):
        assert sorted(P.locate_batches(mixed, wm)) == batches_to_read([1, 11, 21, 31, 41], wm), wm
    assert P.locate_batches(mixed, 25)[21] == P.batch_artifact_path(21)  # the re-flushed copy wins
    assert sorted(P.all_batch_artifacts(mixed)) == sorted(
        [*(flat(s) for s in old), *(P.batch_artifact_path(s) for s in (21, 31, 41))]
    )


def test_locate_batches_cost_does_not_grow_with_history() -> None:
    """A caught-up consumer lists the same few directories whatever the run's length."""
    costs = []
    for n_batches in (100, 10_000, 50_000):
        firsts = firsts_of([10] * n_batches)
        fake = FakeArtifacts([P.batch_artifact_path(s) for s in firsts])
        got = P.locate_batches(fake, firsts[-1] + 3)
        assert list(got) == [firsts[-1]]
        costs.append((fake.listings, fake.entries))
    assert all(listings <= 4 for listings, _ in costs)
    # root (one shard per 10**9 seqs) + one shard per level, <= 1,000 entries each
    assert max(entries for _, entries in costs) <= 1 + 1 + 1000 + 1000
    flat_fake = FakeArtifacts([flat(s) for s in firsts])
    P.locate_batches(flat_fake, firsts[-1] + 3)
    assert flat_fake.entries == 50_000  # the old layout listed every batch


def test_locate_batches_limit_stops_listing_later_shards() -> None:
    firsts = firsts_of([10] * 500)  # 5 leaf shards of 100 batches
    fake = FakeArtifacts([P.batch_artifact_path(s) for s in firsts])
    got = P.locate_batches(fake, 15, limit=3)
    assert sorted(got) == [11, 21, 31]
    assert fake.listings == 4  # root, levels 1 and 2, the first leaf only
    for limit in (0, -3):  # as before shards: at least one batch, the one holding the watermark
        assert sorted(P.locate_batches(fake, 15, limit=limit)) == [11]


def test_sharded_flush_and_read_across_shard_edges(
    mlflow_server: str, tmp_path: Path, record, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """Real MLflow, shards of 100 and 10 seqs (so 7-record batches straddle leaf edges): every
    watermark, edges included, reads exactly the rows after it."""
    from scanflow.tracking import prediction_layout

    monkeypatch.setattr(prediction_layout, "SHARD_DIGITS", (10, 11))  # the layout reads it (the log re-exports it)
    log = PredictionLog(f"sqlite:///{tmp_path / 'p.db'}")
    log.append(recs(record, range(45)))
    res = log.flush_to_mlflow(unique_name, batch_size=7)
    assert res.artifacts[1] == "predictions/0000000000/00000000000/batch-000000000008.parquet"
    assert res.artifacts[2] == "predictions/0000000000/00000000001/batch-000000000015.parquet"
    assert sorted(stored_rows(res.run_id, tmp_path)) == [f"req-{i:06d}" for i in range(45)]
    for wm in (0, 9, 10, 11, 14, 15, 20, 21, 22, 30, 44, 45):
        got = read_since(res.run_id, wm)
        assert [r.request_id for r in got.records] == [f"req-{i:06d}" for i in range(wm, 45)], wm
        assert got.seqs == list(range(wm + 1, 46)) and got.watermark == max(wm, 45)
    # batches 1, 8, 15, 22, 29, 36, 43: at 20 the leaf 20-29 holds only batch 22, so batch 15 (15-21)
    # is found in the leaf before it
    assert read_since(res.run_id, 20).batches_read == 5
    assert read_since(res.run_id, 0, max_batches=2).seqs == list(range(1, 15))


def test_a_run_written_in_the_flat_layout_is_read_after_the_upgrade(
    mlflow_server: str, tmp_path: Path, record, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """History written flat (the layout before shards), a crash after a flat upload, then the upgraded
    writer re-flushes that batch sharded and goes on: readers see every row once, at any watermark."""
    log = PredictionLog(f"sqlite:///{tmp_path / 'p.db'}")
    log.append(recs(record, range(20)))
    with monkeypatch.context() as old_writer:
        old_writer.setattr(P, "batch_artifact_path", flat)
        log.flush_to_mlflow(unique_name, batch_size=5, max_batches=2)  # seq 1-10, flat, committed

        def die(*_a: object) -> None:
            raise KeyboardInterrupt("simulated SIGKILL after upload, before the watermark commit")

        old_writer.setattr(log, "_commit_watermark", die)
        with pytest.raises(KeyboardInterrupt):
            log.flush_to_mlflow(unique_name, batch_size=5)  # seq 11-15 uploaded flat, not committed
    run_id = log.stats().run_id
    assert run_id and log.watermark == 10
    assert read_since(run_id, 0).seqs == list(range(1, 16))  # the flat run reads as before

    res = log.flush_to_mlflow(unique_name, batch_size=4)  # upgraded: re-flushes 11-14 sharded, then 15-20
    assert res.artifacts[0] == P.batch_artifact_path(11) and res.watermark == 20
    held = P.all_batch_artifacts(P.mlflow_lister(run_id))
    assert flat(11) in held and P.batch_artifact_path(11) in held  # both copies of batch 11 exist
    for wm in (0, 5, 10, 11, 13, 14, 15, 19, 20):
        got = read_since(run_id, wm)
        assert got.seqs == list(range(wm + 1, 21)), wm
        assert [r.request_id for r in got.records] == [f"req-{i:06d}" for i in range(wm, 20)]
