"""Prediction logging throughput: Scanflow's batched Parquet flush vs one MLflow artifact per record.

Baseline: the obvious way to keep every prediction in MLflow, `MlflowClient.log_dict` of each record
as its own JSON artifact. Ours: PredictionLog.append (SQLite, de-duplicated) then flush_to_mlflow
(Parquet batches + watermark), and the Checker's read_since. Same records, same real MLflow server on
loopback, side by side in one run; medians of the repeats.

Run: .venv/bin/python benchmarks/tracking.py [--quick]. The last line is one JSON object of figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from scanflow.tracking.predictions import PredictionLog, PredictionRecord, read_since
from scanflow.tracking.server import MlflowServer


def make_records(n: int, tag: str) -> list[PredictionRecord]:
    return [
        PredictionRecord(
            request_id=f"{tag}-{i}",
            service="digits",
            inputs=[[(i % 17) / 16.0] * 64],
            outputs=[i % 10],
            model_version="1",
            latency_ms=1.0,
            ts=time.time(),
            labels=[i % 10],
        )
        for i in range(n)
    ]


def ours(n: int, batch_size: int, work: Path) -> dict[str, float]:
    tag = uuid.uuid4().hex[:8]
    records = make_records(n, tag)
    log = PredictionLog(f"sqlite:///{work / f'{tag}.db'}", name=tag)
    t0 = time.perf_counter()
    for i in range(0, n, 100):  # as the API receives them: 100 records per POST
        log.append(records[i : i + 100])
    t1 = time.perf_counter()
    result = log.flush_to_mlflow(f"bench-{tag}", batch_size=batch_size)
    t2 = time.perf_counter()
    got = read_since(result.run_id, 0)
    t3 = time.perf_counter()
    if len(got) != n:
        raise SystemExit(f"read back {len(got)} of {n} records")
    log.close()
    return {"append_rps": n / (t1 - t0), "flush_rps": n / (t2 - t1), "read_rps": n / (t3 - t2),
            "end_to_end_rps": n / (t2 - t0)}  # fmt: skip


def baseline(n: int) -> dict[str, float]:
    from mlflow import MlflowClient

    from scanflow.tracking.registry import ensure_experiment

    client = MlflowClient()
    tag = uuid.uuid4().hex[:8]
    run = client.create_run(ensure_experiment(f"bench-base-{tag}"))
    records = make_records(n, tag)
    t0 = time.perf_counter()
    for r in records:
        client.log_dict(run.info.run_id, r.model_dump(), f"predictions/{r.request_id}.json")
    t1 = time.perf_counter()
    return {"end_to_end_rps": n / (t1 - t0)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    n, n_base, batch = (1000, 50, 500) if args.quick else (10000, 300, 1000)

    with (
        tempfile.TemporaryDirectory(prefix="scanflow-bench-") as tmp,
        MlflowServer(Path(tmp) / "mlflow") as srv,
    ):
        import mlflow

        mlflow.set_tracking_uri(srv.url)
        runs_ours = [ours(n, batch, Path(tmp)) for _ in range(args.repeats)]
        runs_base = [baseline(n_base) for _ in range(args.repeats)]

    def med(rows: list[dict[str, float]], key: str) -> float:
        return statistics.median(r[key] for r in rows)

    figures = {
        "records": n,
        "baseline_records": n_base,
        "batch_size": batch,
        "repeats": args.repeats,
        "ours_append_rps": round(med(runs_ours, "append_rps")),
        "ours_flush_rps": round(med(runs_ours, "flush_rps")),
        "ours_read_rps": round(med(runs_ours, "read_rps")),
        "ours_end_to_end_rps": round(med(runs_ours, "end_to_end_rps")),
        "baseline_end_to_end_rps": round(med(runs_base, "end_to_end_rps"), 1),
    }
    figures["speedup"] = round(
        figures["ours_end_to_end_rps"] / max(figures["baseline_end_to_end_rps"], 1e-9), 1
    )
    print(f"{'path':<40}{'records/s (median of ' + str(args.repeats) + ')':>28}")
    print(f"{'baseline: log_dict per record':<40}{figures['baseline_end_to_end_rps']:>28}")
    print(f"{'ours: append + Parquet flush':<40}{figures['ours_end_to_end_rps']:>28}")
    print(f"{'  ours: append (SQLite, 100/POST)':<40}{figures['ours_append_rps']:>28}")
    print(f"{'  ours: flush (batch ' + str(batch) + ')':<40}{figures['ours_flush_rps']:>28}")
    print(f"{'  ours: read_since (Checker)':<40}{figures['ours_read_rps']:>28}")
    print(f"speedup end to end: {figures['speedup']}x")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
