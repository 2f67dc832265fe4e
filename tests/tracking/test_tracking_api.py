"""REST face of the prediction log, served by uvicorn in a real subprocess; SIGKILLs while flushing."""

from __future__ import annotations

import random
import time
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest
from mlflow import MlflowClient

from scanflow.tracking import predictions as P

AUTH = {"Authorization": "Bearer test-token-not-a-secret"}


def test_post_predictions_contract(predictions_app, record) -> None:  # type: ignore[no-untyped-def]
    app = predictions_app(max_records=20)  # no experiment: no flusher, the log only
    app.start()
    url = f"{app.url}/predictions"
    with httpx.Client(timeout=10) as c:
        ok = c.post(url, json=[record(i) for i in range(5)], headers=AUTH)
        assert ok.status_code == 200 and ok.json() == {"accepted": 5, "stored": 5, "duplicates": 0, "refused": 0, "conflicts": 0}
        again = c.post(url, json=[record(i) for i in range(3, 8)], headers=AUTH)
        assert again.json() == {"accepted": 5, "stored": 3, "duplicates": 2, "refused": 0, "conflicts": 0}

        assert c.post(url, json=[record(9)]).status_code == 401
        assert c.post(url, json=[record(9)], headers={"Authorization": "Bearer wrong"}).status_code == 401
        too_many = c.post(url, json=[record(i) for i in range(21)], headers=AUTH)
        assert too_many.status_code == 413 and "at most 20" in too_many.text
        huge = c.post(url, content=b"[" + b" " * (9 * 1024 * 1024) + b"]", headers=AUTH)
        assert huge.status_code == 413

        bad = record(10)
        bad["latency_ms"] = -1
        resp = c.post(url, json=[record(11), bad], headers=AUTH)
        assert resp.status_code == 422
        assert resp.json()["detail"][0]["loc"] == [1, "latency_ms"]
        assert c.post(url, content=b"{not json", headers=AUTH).status_code == 422
        # deeper than json.loads recurses, under a content type that is not JSON's: a 422, never a 500
        deep = c.post(url, content=b"[" * 100_000 + b"]" * 100_000, headers={**AUTH, "Content-Type": "text/plain"})
        assert deep.status_code == 422 and "nested too deeply" in deep.text
        assert c.post(url, json={"request_id": "x"}, headers=AUTH).status_code == 422
        ragged = record(12)
        ragged["inputs"] = [[1.0, 2.0], [1.0]]
        assert c.post(url, json=[ragged], headers=AUTH).status_code == 422

        stats = c.get(f"{app.url}/predictions/stats").json()
        assert stats["stored"] == 8 and stats["pending"] == 8 and stats["watermark"] == 0


@pytest.mark.slow
def test_sigkill_while_flushing_neither_loses_nor_duplicates(predictions_app, record, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The process holding the log is SIGKILLed 3 times while it flushes small batches to MLflow."""
    rng = random.Random(7)
    app = predictions_app(batch_size=7, flush_interval=0.01)
    acked: set[str] = set()
    next_id = 0
    pending_at_kill: list[int] = []
    for _round in range(3):
        app.start()
        with httpx.Client(timeout=10) as c:
            start_wm = app.stats()["watermark"]
            for _ in range(rng.randint(3, 6)):
                chunk = [record(i) for i in range(next_id, next_id + 10)]
                resend = [record(i) for i in range(max(0, next_id - 3), next_id)]  # lost-reply retries
                resp = c.post(f"{app.url}/predictions", json=resend + chunk, headers=AUTH)
                assert resp.status_code == 200
                acked.update(r["request_id"] for r in resend + chunk)
                next_id += 10
            # kill once the flusher is demonstrably mid-stream (the watermark moved, work is pending)
            deadline = time.monotonic() + 30
            while (now := app.stats())["watermark"] == start_wm:
                assert time.monotonic() < deadline, "flusher made no progress"
                time.sleep(0.01)  # leave the core to the flusher it waits on
        app.kill()
        pending_at_kill.append(now["pending"])

    assert max(pending_at_kill) > 0, "every kill came after the flush had finished: nothing was tested"
    app.start()  # the last incarnation drains what is pending
    deadline = time.monotonic() + 60
    while (s := app.stats())["pending"] > 0:
        assert time.monotonic() < deadline, f"flush did not drain: {s}"
        time.sleep(0.05)
    run_id = s["run_id"]
    assert s["stored"] == len(acked)
    app.kill()

    client = MlflowClient()
    in_mlflow: list[str] = []
    for path in P.all_batch_artifacts(P.mlflow_lister(run_id)):
        in_mlflow += (
            pq.read_table(client.download_artifacts(run_id, path, str(tmp_path)))
            .column("request_id")
            .to_pylist()
        )
    assert len(in_mlflow) == len(set(in_mlflow)), "a record was stored twice in MLflow"
    assert set(in_mlflow) == acked, "an acknowledged record is missing from MLflow"
    assert {r.request_id for r in P.read_since(run_id, 0).records} == acked
