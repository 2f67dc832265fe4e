"""What a prediction log stores (`PredictionRecord`, one per request id) and what its calls return.

Who uses it: the log (scanflow.tracking.predictions), its reader (scanflow.tracking.prediction_reader),
the Tracker's API, the feedback log (AppendResult) and the replicas' sink.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


class PredictionRecord(BaseModel):
    """One served request: what came in, what went out, by which model version, how fast.

    `inputs` holds the request's rows (one request may carry several). `labels` is still accepted (older
    clients, logs already stored) and kept in the Parquet batches, but the framework no longer reads
    it: replicas refuse labels in /predict, and true labels arrive later as feedback keyed by
    request_id (scanflow.tracking.feedback, the Tracker's POST /feedback).
    """

    model_config = ConfigDict(extra="forbid")

    request_id: str = Field(min_length=1, max_length=200)
    service: str = Field(min_length=1, max_length=200)
    inputs: list[list[FiniteFloat]] = Field(min_length=1)
    outputs: list[Any]
    model_version: str = Field(max_length=100)
    latency_ms: float = Field(ge=0, allow_inf_nan=False)
    ts: float = Field(ge=0, allow_inf_nan=False)
    labels: list[Any] | None = None
    # sent by the replicas' TrackerSink (scanflow/serving/sink.py); accepted, not stored in Parquet
    # (the replica's own retry key: request_id is the record's identity)
    record_id: str | None = Field(None, max_length=200)
    # the id the client sent, echoed only: `request_id` (the identity) is always made by the replica
    client_request_id: str | None = Field(None, max_length=200)
    replica_id: str | None = Field(None, max_length=200)

    @field_validator("inputs")
    @classmethod
    def _rows_same_width(cls, rows: list[list[float]]) -> list[list[float]]:
        widths = {len(r) for r in rows}
        if len(widths) != 1 or 0 in widths:
            raise ValueError(f"every input row needs the same non-zero width, got widths {sorted(widths)}")
        return rows


@dataclass(frozen=True)
class AppendResult:
    """`accepted`: records acknowledged; `stored`: newly stored; the rest were re-sent duplicates, of
    which `conflicts` differ from the record already stored under their id (kept: the first; reported:
    a re-send is identical, so a difference is a forgery or a bug)."""

    accepted: int
    stored: int
    conflicts: int = 0

    @property
    def duplicates(self) -> int:
        return self.accepted - self.stored


@dataclass(frozen=True)
class FlushResult:
    run_id: str
    batches: int
    records: int
    watermark: int
    artifacts: tuple[str, ...] = ()


@dataclass(frozen=True)
class LogStats:
    stored: int
    last_seq: int
    watermark: int
    pending: int
    run_id: str | None


@dataclass
class PredictionBatch:
    """What a consumer gets from `read_since`: records in seq order and the watermark to pass next time."""

    records: list[PredictionRecord]
    seqs: list[int]
    watermark: int
    batches_read: int = 0
    listings: int = 0  # artifact directory listings the read made (one MLflow request each)
    _inputs: np.ndarray | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.records)

    def inputs(self) -> np.ndarray:
        """All input rows of all records stacked: float32 (rows, features); (0, 0) when empty."""
        if self._inputs is None:
            rows = [row for r in self.records for row in r.inputs]
            self._inputs = np.asarray(rows, dtype=np.float32) if rows else np.zeros((0, 0), np.float32)
        return self._inputs

    def labels(self) -> list[Any]:
        """True labels of the records that have them, flattened in order."""
        return [lab for r in self.records if r.labels is not None for lab in r.labels]
