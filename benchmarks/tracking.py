"""Prediction logging throughput: Scanflow's batched Parquet flush vs one MLflow artifact per record.

Baseline: the obvious way to keep every prediction in MLflow, `MlflowClient.log_dict` of each record
as its own JSON artifact. Ours: PredictionLog.append (SQLite, de-duplicated) then flush_to_mlflow
(Parquet batches + watermark), and the Checker's read_since. Same records, same real MLflow server on
loopback, side by side in one run; medians of the repeats.

Second part, read scaling: the Checker's read_since at its newest watermark (one batch to download) on
runs of 100 / 1,000 / 5,000 batches (20,000 more without --quick), in the flat layout (every batch in
`predictions/`, as written before shards: read_since on it lists the whole directory, exactly the old
code path) and in the sharded one, side by side on one server, with the ratio. The batches are real
Parquet files put straight into the server's artifact store (flushing thousands through the API would
take minutes and measure the flush, not the read); each read is checked to return the right rows.

Run: .venv/bin/python benchmarks/tracking.py [--quick] [--part all|throughput|read-scaling].
The last line is one JSON object of figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from scanflow.tracking import predictions as P
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


def read_since_before(run_id: str, watermark: int) -> list[int]:
    """read_since as it was before shards (commit 2fca6e9), for the "before" column: one
    MlflowClient.list_artifacts of the flat directory, MlflowClient.download_artifacts per batch.
    Returns the seqs read."""
    from mlflow import MlflowClient

    client = MlflowClient()
    listed = client.list_artifacts(run_id, P.ARTIFACT_DIR)
    by_first = {s: f.path for f in listed if (s := P.first_seq_of(f.path)) is not None}
    seqs: list[int] = []
    with tempfile.TemporaryDirectory(prefix="scanflow-read-") as tmp:
        for first in P.batches_to_read(list(by_first), watermark):
            local = client.download_artifacts(run_id, by_first[first], tmp)
            seqs += [seq for seq, _ in P.from_parquet(Path(local)) if seq > watermark]
    return sorted(seqs)


READ_BATCH = 10  # records per batch in the read-scaling runs (the listing cost depends on the count)


def fill_run(artifact_root: Path, n_batches: int, sharded: bool) -> int:
    """Put `n_batches` real Parquet batches of READ_BATCH records into a run's artifact directory on
    the server's disk, in one layout. Returns the last seq."""
    records = make_records(READ_BATCH, "fill")
    bodies = [r.model_dump_json() for r in records]
    for b in range(n_batches):
        first = b * READ_BATCH + 1
        rel = P.batch_artifact_path(first) if sharded else f"{P.ARTIFACT_DIR}/{P.batch_artifact_name(first)}"
        path = artifact_root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(P.to_parquet(zip(range(first, first + READ_BATCH), bodies, strict=True)))
    return n_batches * READ_BATCH


def read_scaling(home: Path, counts: list[int], repeats: int) -> list[dict[str, float]]:
    """Median read_since time at the newest watermark per batch count: before, flat, sharded."""
    from mlflow import MlflowClient

    from scanflow.tracking.registry import ensure_experiment

    client = MlflowClient()
    exp = ensure_experiment(f"bench-read-{uuid.uuid4().hex[:8]}")
    rows = []
    for n in counts:
        runs = {}
        for layout in ("flat", "sharded"):
            run = client.create_run(exp)
            # mlflow-artifacts:/<exp>/<run>/artifacts lives under the server's --artifacts-destination
            root = home / "artifacts" / run.info.artifact_uri.split(":", 1)[1].lstrip("/")
            runs[layout] = (run.info.run_id, fill_run(root, n, sharded=layout == "sharded"))
        times: dict[str, list[float]] = {"before": [], "flat": [], "sharded": []}
        listings: dict[str, int] = {}
        for _ in range(repeats):  # variants alternate, so a burst of load hits all alike
            for variant, samples in times.items():
                run_id, last = runs["flat" if variant == "before" else variant]
                wm = last - READ_BATCH // 2  # caught up: only the newest batch holds rows after it
                t0 = time.perf_counter()
                if variant == "before":
                    seqs = read_since_before(run_id, wm)
                else:
                    got = read_since(run_id, wm)
                    seqs, listings[variant] = got.seqs, got.listings
                samples.append(time.perf_counter() - t0)
                if seqs != list(range(wm + 1, last + 1)):
                    raise SystemExit(f"{variant} at {n} batches: read {seqs[:3]}... after {wm}")
        row: dict[str, float] = {"batches": n}
        for variant, samples in times.items():
            row[f"{variant}_ms"] = statistics.median(samples) * 1000
        row["flat_listings"], row["sharded_listings"] = listings["flat"], listings["sharded"]
        row["before_over_sharded"] = row["before_ms"] / row["sharded_ms"]
        row["flat_over_sharded"] = row["flat_ms"] / row["sharded_ms"]
        rows.append(row)
    return rows


def main() -> None:
    from scanflow.platform.children import stop_children_on_exit

    stop_children_on_exit()  # its servers stop on any exit: exception, Ctrl-C, SIGTERM, SIGHUP
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--part", choices=("all", "throughput", "read-scaling"), default="all")
    args = ap.parse_args()
    n, n_base, batch = (1000, 50, 500) if args.quick else (10000, 300, 1000)
    counts = [100, 1000, 5000] if args.quick else [100, 1000, 5000, 20000]

    figures: dict[str, object] = {}
    with (
        tempfile.TemporaryDirectory(prefix="scanflow-bench-") as tmp,
        MlflowServer(Path(tmp) / "mlflow") as srv,
    ):
        import mlflow

        mlflow.set_tracking_uri(srv.url)
        if args.part in ("all", "throughput"):
            runs_ours = [ours(n, batch, Path(tmp)) for _ in range(args.repeats)]
            runs_base = [baseline(n_base) for _ in range(args.repeats)]
            figures.update(throughput(args, n, n_base, batch, runs_ours, runs_base))
        if args.part in ("all", "read-scaling"):
            scaling = read_scaling(srv.home, counts, max(5, args.repeats))
            print(f"\nread_since at the newest watermark, ms (median of {max(5, args.repeats)}), "
                  f"{READ_BATCH} records/batch")  # fmt: skip
            print("before: flat layout, old read_since; flat: flat layout, new read_since; sharded: new both")
            head = ("batches", "before", "flat", "sharded", "before/sharded", "flat/sharded", "listings f/s")
            print("".join(f"{h:>15}" for h in head))
            for r in scaling:
                cells = [f"{int(r['batches'])}", *(f"{r[k]:.1f}" for k in ("before_ms", "flat_ms", "sharded_ms")),
                         f"{r['before_over_sharded']:.2f}", f"{r['flat_over_sharded']:.2f}",
                         f"{int(r['flat_listings'])}/{int(r['sharded_listings'])}"]  # fmt: skip
                print("".join(f"{c:>15}" for c in cells))
            figures["read_scaling"] = [{k: round(v, 2) for k, v in r.items()} for r in scaling]
    print(json.dumps(figures))


def throughput(
    args: argparse.Namespace,
    n: int,
    n_base: int,
    batch: int,
    runs_ours: list[dict[str, float]],
    runs_base: list[dict[str, float]],
) -> dict[str, object]:
    """Print the throughput table; return its figures."""

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
    return dict(figures)


if __name__ == "__main__":
    main()
