"""A prediction batch's bytes: Parquet (one row per record) for the data, and a CSV preview of its first
rows for people looking at the run in the MLflow UI.

Who uses it: the log's flush (scanflow.tracking.predictions) and its reader
(scanflow.tracking.prediction_reader).
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from scanflow.tracking.prediction_records import PredictionRecord

PREVIEW_NAME = "latest-batch-preview.csv"
PREVIEW_ROWS = 50
PREVIEW_VALUES = 8  # input values shown per row; the row's width is given beside them


def preview_csv(rows: Sequence[tuple[int, str]], limit: int = PREVIEW_ROWS) -> str:
    """Pure: the first `limit` records of a batch as CSV (seq, time, request id, service, model version,
    latency, output, label, the first input values and the input width), for people looking at the
    run in the MLflow UI. The Parquet batches stay the data; this is only a look at them."""
    import csv
    import datetime as dt

    buf = io.StringIO()
    out = csv.writer(buf)
    out.writerow(["seq", "time_utc", "request_id", "service", "model_version", "latency_ms", "outputs",
                  "labels", "inputs_head", "input_width"])
    for seq, body in rows[:limit]:
        rec = json.loads(body)
        inputs = rec.get("inputs") or []
        flat = [v for row in inputs for v in (row if isinstance(row, list) else [row])]
        when = dt.datetime.fromtimestamp(float(rec.get("ts", 0.0)), dt.UTC).isoformat(timespec="milliseconds")
        out.writerow([seq, when, rec.get("request_id"), rec.get("service"), rec.get("model_version"),
                      round(float(rec.get("latency_ms", 0.0)), 3), json.dumps(rec.get("outputs"))[:120],
                      "" if rec.get("labels") is None else json.dumps(rec["labels"])[:120],
                      " ".join(f"{float(v):.4g}" for v in flat[:PREVIEW_VALUES]), len(flat)])
    return buf.getvalue()


# Parquet encoding: one row per record, inputs as list<list<float32>>


def to_parquet(rows: Iterable[tuple[int, str]]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    seqs: list[int] = []
    cols: dict[str, list[Any]] = {
        k: []
        for k in (
            "request_id",
            "service",
            "inputs",
            "outputs",
            "model_version",
            "latency_ms",
            "ts",
            "labels",
            "client_request_id",
            "replica_id",
        )
    }
    for seq, body in rows:
        rec = json.loads(body)
        seqs.append(seq)
        cols["request_id"].append(rec["request_id"])
        cols["service"].append(rec["service"])
        cols["inputs"].append(rec["inputs"])
        cols["outputs"].append(json.dumps(rec["outputs"]))
        cols["model_version"].append(rec["model_version"])
        cols["latency_ms"].append(float(rec["latency_ms"]))
        cols["ts"].append(float(rec["ts"]))
        cols["labels"].append(None if rec.get("labels") is None else json.dumps(rec["labels"]))
        cols["client_request_id"].append(rec.get("client_request_id"))
        cols["replica_id"].append(rec.get("replica_id"))
    table = pa.table(
        {
            "seq": pa.array(seqs, pa.int64()),
            "request_id": pa.array(cols["request_id"], pa.string()),
            "service": pa.array(cols["service"], pa.string()),
            "inputs": pa.array(cols["inputs"], pa.list_(pa.list_(pa.float32()))),
            "outputs_json": pa.array(cols["outputs"], pa.string()),
            "model_version": pa.array(cols["model_version"], pa.string()),
            "latency_ms": pa.array(cols["latency_ms"], pa.float64()),
            "ts": pa.array(cols["ts"], pa.float64()),
            "labels_json": pa.array(cols["labels"], pa.string()),
            # correlation: the client's own id and the replica that answered (batches written before
            # these columns existed read them as None)
            "client_request_id": pa.array(cols["client_request_id"], pa.string()),
            "replica_id": pa.array(cols["replica_id"], pa.string()),
        }
    )
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def from_parquet(path: Path) -> list[tuple[int, PredictionRecord]]:
    import pyarrow.parquet as pq

    data = pq.read_table(path).to_pylist()
    out: list[tuple[int, PredictionRecord]] = []
    for row in data:
        # validated when appended: construct without re-validating (the Checker reads thousands of rows)
        rec = PredictionRecord.model_construct(
            request_id=row["request_id"],
            service=row["service"],
            inputs=row["inputs"],
            outputs=json.loads(row["outputs_json"]),
            model_version=row["model_version"],
            latency_ms=row["latency_ms"],
            ts=row["ts"],
            labels=None if row["labels_json"] is None else json.loads(row["labels_json"]),
            client_request_id=row.get("client_request_id"),
            replica_id=row.get("replica_id"),
        )
        out.append((int(row["seq"]), rec))
    return out
