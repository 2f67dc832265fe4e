"""Reading a prediction log from MLflow, as the Checker and the Executor do: find the run a log flushes
into, and read the records flushed after a watermark, each once, in seq order (the rule that keeps a
consumer from missing or repeating a row: scanflow.tracking.predictions, step 3).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

from scanflow.tracking.prediction_layout import (
    LOG_NAME_RE,
    RUN_TAG,
    locate_batches,
    mlflow_lister,
    run_artifact_repo,
)
from scanflow.tracking.prediction_parquet import from_parquet
from scanflow.tracking.prediction_records import PredictionBatch, PredictionRecord


def prediction_run_id(experiment: str, name: str = "default") -> str | None:
    """The run a prediction log named `name` flushes into, in `experiment` (None if none yet)."""
    from mlflow import MlflowClient

    if not LOG_NAME_RE.fullmatch(name):
        raise ValueError(f"log name {name!r}: use 1-100 letters, digits, '.', '_' or '-'")
    client = MlflowClient()
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return None
    runs = client.search_runs(
        [exp.experiment_id],
        filter_string=f"tags.`{RUN_TAG}` = '{name}'",
        order_by=["attributes.start_time ASC"],
        max_results=1,
    )
    return runs[0].info.run_id if runs else None


def read_since(run_id: str, watermark: int = 0, *, max_batches: int | None = None) -> PredictionBatch:
    """Records flushed to `run_id` with seq > `watermark`, in seq order, and the next watermark. Blocking.

    `max_batches` bounds one call's work (a Checker catching up after a long outage). Lists the shard
    directories at and after the watermark only (`locate_batches`): a caught-up consumer's cost does
    not grow with the run's history. Reads runs written before shards existed too.
    """
    import os

    # a consumer polls in a loop: per-download progress bars would flood agent logs
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    repo = run_artifact_repo(run_id)
    lister = mlflow_lister(run_id, repo)
    listings = 0

    def counted(path: str) -> Sequence[tuple[str, bool]]:
        nonlocal listings
        listings += 1
        return lister(path)

    by_first = locate_batches(counted, watermark, limit=max_batches)
    wanted = sorted(by_first)
    records: list[PredictionRecord] = []
    seqs: list[int] = []
    seen: set[int] = set()
    new_wm = watermark
    with tempfile.TemporaryDirectory(prefix="scanflow-read-") as tmp:
        for first in wanted:
            local = repo.download_artifacts(by_first[first], tmp)
            for seq, rec in from_parquet(Path(local)):
                if seq > watermark and seq not in seen:
                    seen.add(seq)
                    seqs.append(seq)
                    records.append(rec)
                    new_wm = max(new_wm, seq)
    order = sorted(range(len(seqs)), key=seqs.__getitem__)
    return PredictionBatch(
        records=[records[i] for i in order],
        seqs=[seqs[i] for i in order],
        watermark=new_wm,
        batches_read=len(wanted),
        listings=listings,
    )
