"""The feedback log (true labels by request_id): exactly once, first wins, paging, lookups, its REST face
served by uvicorn on loopback, its clients, and a SIGKILL of the process holding it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from pydantic import ValidationError

from scanflow.agent.client import AgentHTTPError
from scanflow.tracking.feedback import (
    MAX_LOOKUP_IDS,
    FeedbackLog,
    FeedbackPage,
    FeedbackRecord,
    FeedbackStats,
)
from scanflow.tracking.feedback_api import feedback_router
from scanflow.tracking.feedback_client import alookup_feedback, lookup_feedback, post_feedback
from scanflow.tracking.predictions import AppendResult

TOKEN = "test-token-not-a-secret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def fb(i: int, label: Any = None, **extra: Any) -> FeedbackRecord:
    return FeedbackRecord(request_id=f"req-{i:05d}", labels=[i % 10 if label is None else label], **extra)


@pytest.fixture
def log(tmp_path: Path) -> Iterable[FeedbackLog]:
    fl = FeedbackLog(f"sqlite:///{tmp_path / 'feedback.db'}")
    try:
        yield fl
    finally:
        fl.close()


# --- the log -----------------------------------------------------------------------------------


def test_resend_is_acknowledged_and_stored_once(log: FeedbackLog) -> None:
    first = log.append([fb(i) for i in range(3)])
    assert (first.accepted, first.stored, first.duplicates) == (3, 3, 0)
    again = log.append([fb(i) for i in range(1, 5)])  # two re-sent, two new
    assert (again.accepted, again.stored, again.duplicates) == (4, 2, 2)
    stats = log.stats()
    assert stats.stored == 5 and stats.last_seq >= 5  # seqs may have gaps (a skipped duplicate may draw one)


def test_first_labels_win_over_a_later_conflicting_record(log: FeedbackLog) -> None:
    log.append([fb(1, 3)])
    later = log.append([fb(1, 8), fb(2, "cat"), fb(2, "dog")])  # a conflict, and one inside a single call
    assert (later.stored, later.duplicates) == (1, 2)
    assert log.lookup(["req-00001", "req-00002"]) == {"req-00001": [3], "req-00002": ["cat"]}


def test_since_pages_in_seq_order_and_seqs_are_never_reused(log: FeedbackLog) -> None:
    log.append([fb(i) for i in range(7)])
    seen: list[int] = []
    ids: list[str] = []
    after = 0
    while (page := log.since(after, limit=3)).records:
        assert len(page.records) <= 3 and page.next == page.records[-1].seq
        seen += [r.seq for r in page.records]
        ids += [r.request_id for r in page.records]
        after = page.next
    assert seen == sorted(seen) and len(set(seen)) == 7
    assert ids == [f"req-{i:05d}" for i in range(7)]
    assert log.since(after) == FeedbackPage([], after)  # nothing new: `next` stays where it was
    log.append([fb(1)])  # a duplicate draws no seq that a consumer would see
    log.append([fb(99)])
    newer = log.since(after).records
    assert [r.request_id for r in newer] == ["req-00099"] and newer[0].seq > seen[-1]
    with pytest.raises(ValueError, match="limit"):
        log.since(0, limit=5001)


def test_lookup_leaves_missing_ids_out_and_is_bounded(log: FeedbackLog) -> None:
    log.append([fb(i) for i in range(0, 1200, 2)])  # even ids only; more than one IN chunk
    wanted = [f"req-{i:05d}" for i in range(1200)]
    got = log.lookup(wanted)
    assert len(got) == 600 and got["req-01198"] == [8] and "req-00001" not in got
    assert log.lookup([]) == {}
    with pytest.raises(ValueError, match="at most"):
        log.lookup(f"id-{i}" for i in range(MAX_LOOKUP_IDS + 1))


def test_ts_and_received_at_are_kept(log: FeedbackLog) -> None:
    log.append([fb(1, ts=1_700_000_000.5), fb(2)], now=42.0)
    a, b = log.since(0).records
    assert (a.ts, a.received_at, b.ts) == (1_700_000_000.5, 42.0, None)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"request_id": "r", "labels": []}, "labels"),
        ({"request_id": "r", "labels": [True]}, "labels"),
        ({"request_id": "r", "labels": [float("nan")]}, "labels"),
        ({"request_id": "r", "labels": ["x" * 201]}, "labels"),
        ({"request_id": "r", "labels": [None]}, "labels"),
        ({"request_id": "r", "labels": [[1]]}, "labels"),
        ({"request_id": "r", "labels": [0] * 10_001}, "labels"),
        ({"request_id": "", "labels": [1]}, "request_id"),
        ({"request_id": 5, "labels": [1]}, "request_id"),
        ({"request_id": "r", "labels": [1], "ts": -1}, "ts"),
        ({"request_id": "r", "labels": [1], "inputs": [[1.0]]}, "inputs"),
    ],
)
def test_record_validation(body: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        FeedbackRecord.model_validate(body)
    assert info.value.errors()[0]["loc"][0] == field


def test_labels_may_be_ints_floats_and_strings() -> None:
    rec = FeedbackRecord.model_validate({"request_id": "r", "labels": [1, 2.5, "cat"], "ts": 3})
    assert rec.labels == [1, 2.5, "cat"] and type(rec.labels[0]) is int


# --- the router over HTTP ----------------------------------------------------------------------


class Flaky:
    """A FeedbackLog whose first `fail` appends raise (the Tracker answers 500), counting calls."""

    def __init__(self, log: FeedbackLog, fail: int = 0) -> None:
        self.log, self.fail = log, fail
        self.appends = 0
        self.lookups = 0
        self._lock = threading.Lock()

    def append(self, records: Sequence[FeedbackRecord]) -> AppendResult:
        with self._lock:
            self.appends += 1
            if self.appends <= self.fail:
                raise RuntimeError("database briefly unavailable")
        return self.log.append(records)

    def since(self, after_seq: int = 0, limit: int = 1000) -> FeedbackPage:
        return self.log.since(after_seq, limit)

    def lookup(self, request_ids: Iterable[str]) -> dict[str, list[Any]]:
        with self._lock:
            self.lookups += 1
        return self.log.lookup(request_ids)

    def stats(self) -> FeedbackStats:
        return self.log.stats()


# deeper than json.loads can recurse (RecursionError); under every body limit
DEEP = b"[" * 100_000 + b"]" * 100_000


def make_app(store: Any, token: str | None = TOKEN, **kw: Any) -> FastAPI:
    app = FastAPI()
    app.include_router(feedback_router(store, token, **kw))
    return app


def test_post_feedback_contract(serve_app, log: FeedbackLog) -> None:  # type: ignore[no-untyped-def]
    url = serve_app(make_app(log, max_records=20)) + "/feedback"
    rec = [{"request_id": f"r{i}", "labels": [i]} for i in range(5)]
    with httpx.Client(timeout=10) as c:
        ok = c.post(url, json=rec, headers=AUTH)
        assert ok.status_code == 200 and ok.json() == {"accepted": 5, "stored": 5, "duplicates": 0}
        conflicting = [{"request_id": "r0", "labels": [9]}, {"request_id": "r5", "labels": ["x"], "ts": 1.0}]
        assert c.post(url, json=conflicting, headers=AUTH).json() == {"accepted": 2, "stored": 1, "duplicates": 1}
        assert log.lookup(["r0"]) == {"r0": [0]}

        assert c.post(url, json=rec).status_code == 401
        assert c.post(url, json=rec, headers={"Authorization": "Bearer wrong"}).status_code == 401

        bad = c.post(url, json=[rec[0], {"request_id": "r7", "labels": [1, True]}], headers=AUTH)
        assert bad.status_code == 422
        detail = bad.json()["detail"]
        assert detail[0]["loc"] == [1, "labels", 1] and "record 1, field 'labels.1'" in detail[0]["msg"]
        extra = c.post(url, json=[{"request_id": "r8", "labels": [1], "label": 1}], headers=AUTH)
        assert extra.status_code == 422 and extra.json()["detail"][0]["loc"] == [0, "label"]
        for body in (b"{not json", b'{"request_id": "r"}', b"\xff\xfe", b"[1]", b"null", DEEP):
            resp = c.post(url, content=body, headers={**AUTH, "Content-Type": "text/plain"})
            assert resp.status_code == 422, body[:20]
        too_many = c.post(url, json=[{"request_id": f"m{i}", "labels": [1]} for i in range(21)], headers=AUTH)
        assert too_many.status_code == 413 and "at most 20" in too_many.text
        huge = c.post(url, content=b"[" + b" " * (5 * 1024 * 1024) + b"]", headers=AUTH)
        assert huge.status_code == 413 and "larger than" in huge.text
    assert log.stats().stored == 6  # nothing of the refused bodies was stored


def test_without_a_configured_token_posts_are_refused(serve_app, log: FeedbackLog) -> None:  # type: ignore[no-untyped-def]
    url = serve_app(make_app(log, token=None))
    with httpx.Client(timeout=10) as c:
        assert c.post(f"{url}/feedback", json=[{"request_id": "r", "labels": [1]}], headers=AUTH).status_code == 403
        assert c.post(f"{url}/feedback/lookup", json={"request_ids": ["r"]}, headers=AUTH).status_code == 403
        assert c.get(f"{url}/feedback/stats").json() == {"stored": 0, "last_seq": 0}


def test_lookup_page_and_stats_over_http(serve_app, log: FeedbackLog) -> None:  # type: ignore[no-untyped-def]
    url = serve_app(make_app(log, max_lookup_ids=50))
    log.append([fb(i) for i in range(10)])
    with httpx.Client(timeout=10) as c:
        got = c.post(f"{url}/feedback/lookup", json={"request_ids": ["req-00001", "nope", "req-00003"]}, headers=AUTH)
        assert got.json() == {"labels": {"req-00001": [1], "req-00003": [3]}, "missing": 1}
        assert c.post(f"{url}/feedback/lookup", json={"request_ids": ["req-00001"]}).status_code == 401
        bad = c.post(f"{url}/feedback/lookup", json={"request_ids": ["a", 7]}, headers=AUTH)
        assert bad.status_code == 422 and "request_ids[1]" in bad.text
        assert c.post(f"{url}/feedback/lookup", json=["a"], headers=AUTH).status_code == 422
        assert c.post(f"{url}/feedback/lookup", content=b"{", headers=AUTH).status_code == 422
        deep = c.post(f"{url}/feedback/lookup", content=DEEP, headers={**AUTH, "Content-Type": "text/plain"})
        assert deep.status_code == 422 and "nested too deeply" in deep.text
        many = c.post(f"{url}/feedback/lookup", json={"request_ids": [str(i) for i in range(51)]}, headers=AUTH)
        assert many.status_code == 413 and "at most 50" in many.text

        assert c.get(f"{url}/feedback", params={"after": 0}).status_code == 401  # labels are not for anyone
        first = c.get(f"{url}/feedback", params={"after": 0, "limit": 4}, headers=AUTH).json()
        assert [r["request_id"] for r in first["records"]] == [f"req-{i:05d}" for i in range(4)]
        assert set(first["records"][0]) == {"seq", "request_id", "labels", "ts"}
        rest = c.get(f"{url}/feedback", params={"after": first["next"], "limit": 100}, headers=AUTH).json()
        assert len(rest["records"]) == 6
        assert (c.get(f"{url}/feedback", params={"after": rest["next"]}, headers=AUTH).json()
                == {"records": [], "next": rest["next"]})
        assert c.get(f"{url}/feedback", params={"limit": 5001}, headers=AUTH).status_code == 422
        assert c.get(f"{url}/feedback", params={"after": -1}, headers=AUTH).status_code == 422
        assert c.get(f"{url}/feedback/stats").json() == {"stored": 10, "last_seq": rest["next"]}


# --- the clients -------------------------------------------------------------------------------


def test_clients_post_retry_5xx_and_look_up_in_chunks(serve_app, log: FeedbackLog, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import scanflow.tracking.feedback_client as client

    store = Flaky(log, fail=2)
    url = serve_app(make_app(store))
    monkeypatch.setattr(client, "LOOKUP_CHUNK", 4)
    records = [{"request_id": f"r{i}", "labels": [i]} for i in range(10)]
    assert post_feedback(url, TOKEN, records, backoff_s=0.01) == {"accepted": 10, "stored": 10, "duplicates": 0}
    assert store.appends == 3  # two 500s retried, then stored once
    ids = [f"r{i}" for i in range(10)] + ["missing"]
    want = {f"r{i}": [i] for i in range(10)}
    assert lookup_feedback(url, TOKEN, ids) == want and store.lookups == 3  # 11 ids, 4 per call
    assert asyncio.run(alookup_feedback(url, TOKEN, ids)) == want and store.lookups == 6
    assert lookup_feedback(url, TOKEN, []) == {}


def test_clients_raise_at_once_on_4xx(serve_app, log: FeedbackLog) -> None:  # type: ignore[no-untyped-def]
    store = Flaky(log)
    url = serve_app(make_app(store))
    with pytest.raises(AgentHTTPError) as info:
        post_feedback(url, TOKEN, [{"request_id": "r", "labels": []}], backoff_s=0.01)
    assert info.value.status == 422 and "labels" in str(info.value) and store.appends == 0
    with pytest.raises(AgentHTTPError) as denied:
        lookup_feedback(url, "wrong", ["r"], backoff_s=0.01)
    assert denied.value.status == 401 and store.lookups == 0


def test_bounded_retries_on_a_dead_tracker(port: int) -> None:
    with pytest.raises(httpx.ConnectError):
        lookup_feedback(f"http://127.0.0.1:{port}", TOKEN, ["r"], retries=1, backoff_s=0.01, timeout_s=1)


# --- a SIGKILL between appends -----------------------------------------------------------------


def test_sigkill_loses_no_acknowledged_feedback(feedback_app) -> None:  # type: ignore[no-untyped-def]
    """A poster keeps sending batches (each re-sending the previous one's tail); the process holding the
    log is SIGKILLed mid-stream. Every acknowledged record is there after a restart, once."""
    feedback_app.start()
    acked: list[str] = []
    stop = threading.Event()
    enough = threading.Event()

    def poster() -> None:
        n = 0
        with httpx.Client(timeout=5) as c:
            while not stop.is_set():
                batch = [{"request_id": f"k{i}", "labels": [i % 10]} for i in range(max(0, n - 5), n + 20)]
                try:
                    r = c.post(f"{feedback_app.url}/feedback", json=batch, headers=AUTH)
                except httpx.HTTPError:
                    return  # the process is gone
                assert r.status_code == 200
                acked.extend(b["request_id"] for b in batch)
                n += 20
                if n >= 200:
                    enough.set()

    thread = threading.Thread(target=poster)
    thread.start()
    assert enough.wait(60), "the poster made no progress"
    feedback_app.kill()  # SIGKILL, while the poster is still sending
    stop.set()
    thread.join(timeout=30)
    feedback_app.start()
    unique = set(acked)
    with httpx.Client(timeout=10) as c:
        stats = c.get(f"{feedback_app.url}/feedback/stats").json()
        got: dict[str, Any] = {}
        ids = sorted(unique)
        for i in range(0, len(ids), 5000):
            r = c.post(f"{feedback_app.url}/feedback/lookup", json={"request_ids": ids[i : i + 5000]}, headers=AUTH)
            got.update(r.json()["labels"])
        pages: list[str] = []
        after = 0
        while recs := (c.get(f"{feedback_app.url}/feedback", params={"after": after, "limit": 5000},
                             headers=AUTH).json()):
            if not recs["records"]:
                break
            pages += [r["request_id"] for r in recs["records"]]
            after = recs["next"]
    assert len(unique) >= 200 and set(got) == unique
    assert all(got[f"k{i}"] == [i % 10] for i in range(len(unique)))
    assert len(pages) == len(set(pages)) == stats["stored"] >= len(unique)  # each stored once
