"""In-process CPU per client request of a replica's two hot paths, without HTTP or torch.

    PYTHONPATH=. .venv/bin/python benchmarks/replica_item_cpu.py [--calls 400] [--items 26] [--rounds 3] \
        [--spool-dir DIR] [--tracker]

Why: the serving hardening (per-item parse guards, Content-Type check, body deadline, the durable record
spool) adds a few microseconds per request, too few to resolve against the 3-5 % run-to-run spread of
`serving_cpu.py` on a shared 2-core machine. Here the replica's raw ASGI handlers (`POST /predict`,
`POST /predict_batch`) are called directly with in-memory receive/send, on a numpy stand-in model (a
matrix product: the model's cost is not what is measured), and the CPU of the whole process (every
thread: the loop, the model thread, the spool's fsync thread) is read with `time.process_time` around
each pass. `--tracker` gives the replica a Tracker URL nobody listens on, so every request also builds
its prediction record (and with `--spool-dir`, appends it to the spool) while the sends fail and back
off, the state during a Tracker outage. Runs against any checkout on PYTHONPATH (flags a tree does not
know are left out), so paired before/after figures come from the same script. The last line is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import shutil
import statistics
import tempfile
import time
from typing import Any

import numpy as np
import orjson

from scanflow.serving import batchwire
from scanflow.serving.model import LoadedModel
from scanflow.serving.replica_server import ReplicaConfig, create_app

N_FEATURES = 64


def fake_model() -> LoadedModel:
    w = np.random.default_rng(0).standard_normal((N_FEATURES, 10)).astype(np.float32)

    def predict(x: np.ndarray) -> tuple[list, np.ndarray | None]:
        p = x @ w
        return p.argmax(axis=1).tolist(), p

    return LoadedModel("bench", "bench", "1", N_FEATURES, predict)


async def call(app: Any, path: str, body: bytes, ctype: bytes, answer: list[bytes] | None = None) -> int:
    """One request through the ASGI app; returns the status (and the body into `answer` when given)."""
    sent: list[dict[str, Any]] = []
    done = False

    async def receive() -> dict[str, Any]:
        nonlocal done
        if done:
            await asyncio.Event().wait()
        done = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)

    scope = {"type": "http", "method": "POST", "path": path,
             "headers": [(b"content-type", ctype), (b"content-length", str(len(body)).encode())]}
    await app(scope, receive, send)
    if answer is not None:
        answer.append(b"".join(m.get("body", b"") for m in sent[1:]))
    return int(sent[0]["status"])


async def check_items(app: Any, batch: bytes, n: int) -> None:
    """Every item of a coalesced call answered 200: a pass timing refusals would measure nothing."""
    answer: list[bytes] = []
    assert await call(app, "/predict_batch", batch, batchwire.CONTENT_TYPE, answer) == 200
    statuses = {status for status, _ in batchwire.decode_response(answer[0], n)}
    if statuses != {200}:
        raise SystemExit(f"replica_item_cpu: items answered {sorted(statuses)}, not all 200: {answer[0][:300]!r}")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    fields = {f.name for f in dataclasses.fields(ReplicaConfig)}
    kw: dict[str, Any] = {"model_uri": "bench", "allow_anonymous": True, "service": "bench"}
    if args.tracker:
        kw["tracker_url"] = "http://127.0.0.1:9"  # discard port: refused at once, the sink backs off
    if args.spool_dir and "spool_dir" in fields:
        kw["spool_dir"] = args.spool_dir
    app = create_app(ReplicaConfig(**kw))
    replica = app.replica
    rows = np.random.default_rng(1).random((args.items, N_FEATURES)).round(4).tolist()
    bodies = [orjson.dumps({"inputs": [r], "request_id": f"req-{i}"}) for i, r in enumerate(rows)]
    batch = batchwire.encode_request(bodies)
    # the same rows as Open Inference Protocol v2 infer bodies, coalesced as the gateway's fast front frames them
    v2_bodies = [orjson.dumps({"id": f"req-{i}", "inputs": [{"name": "input", "shape": [1, N_FEATURES],
                                                              "datatype": "FP32", "data": r}]})
                 for i, r in enumerate(rows)]
    v2_batch = batchwire.encode_request(v2_bodies, [("bench", None)] * len(v2_bodies))
    out: dict[str, list[float]] = {"predict_batch_us_per_item": [], "predict_batch_v2_us_per_item": [],
                                   "predict_us_per_request": []}
    async with replica.lifespan(app.api):
        await replica._install(fake_model())
        if replica.sink is not None:
            replica.sink.max_buffer = 10**9  # the outage lasts the whole run: keep every record
        await check_items(app, batch, len(bodies))
        await check_items(app, v2_batch, len(v2_bodies))
        for _ in range(args.rounds):
            t0 = time.process_time()
            for _ in range(args.calls):
                assert await call(app, "/predict_batch", batch, batchwire.CONTENT_TYPE) == 200
            out["predict_batch_us_per_item"].append((time.process_time() - t0) / (args.calls * args.items) * 1e6)
            t0 = time.process_time()
            for _ in range(args.calls):
                assert await call(app, "/predict_batch", v2_batch, batchwire.CONTENT_TYPE) == 200
            out["predict_batch_v2_us_per_item"].append((time.process_time() - t0) / (args.calls * args.items) * 1e6)
            n = args.calls * 4
            t0 = time.process_time()
            for i in range(n):
                assert await call(app, "/predict", bodies[i % len(bodies)], b"application/json") == 200
            out["predict_us_per_request"].append((time.process_time() - t0) / n * 1e6)
        pending = replica.sink.pending if replica.sink is not None else 0
        spool = replica._spool_info() if hasattr(replica, "_spool_info") else None
    return {**{k: round(statistics.median(v), 2) for k, v in out.items()},
            "rounds": {k: [round(x, 2) for x in v] for k, v in out.items()},
            "spool": bool(args.spool_dir and "spool_dir" in fields), "tracker": args.tracker,
            "records_pending": pending, "spool_info": spool}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=400, help="coalesced calls per round (x4 direct requests)")
    p.add_argument("--items", type=int, default=26, help="client requests per coalesced call")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tracker", action="store_true", help="build prediction records (Tracker down)")
    p.add_argument("--spool-dir", default=None, help="durable record spool here (needs --tracker)")
    args = p.parse_args()
    made = args.spool_dir == "tmp"
    if made:
        args.spool_dir = tempfile.mkdtemp(prefix="scanflow-spool-bench-")
    try:
        print(json.dumps(asyncio.run(run(args))))
    finally:
        if made:
            shutil.rmtree(args.spool_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
