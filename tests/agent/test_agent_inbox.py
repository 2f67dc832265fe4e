"""The inbox writer: group commit, dedup inside a group, commit-order hand-over, checkpoints off the
request path, and the loop's in-memory hand-over falling back to the table (real SQLite files)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest
from agent_support import drained, running

from scanflow.agent import Action, Agent, Store
from scanflow.agent import runtime as runtime_mod
from scanflow.agent.types import Event


def test_concurrent_submits_commit_once_each_with_contiguous_ids_and_dedup_in_a_group(store: Store) -> None:
    # 60 submits in a burst (they share groups); every 3rd repeats an earlier key
    futures: list[Future[tuple[int, bool]]] = []
    for i in range(60):
        key = f"k{i - 1}" if i % 3 == 2 else f"k{i}"
        futures.append(store.submit_event("burst", {"i": i}, key=key))
    results = [f.result(timeout=10) for f in futures]
    new_ids = [eid for eid, dup in results if not dup]
    assert new_ids == list(range(1, 41))  # contiguous, in submit order: no id burnt by a duplicate
    for i, (eid, dup) in enumerate(results):
        if i % 3 == 2:
            assert dup and eid == results[i - 1][0]
    assert store.count_events("pending") == 40
    assert store.pending_events(limit=1)[0].payload == {"i": 0}


def test_submits_from_many_threads_all_land(store: Store) -> None:
    out: list[int] = []
    lock = threading.Lock()

    def producer(t: int) -> None:
        for i in range(25):
            eid, _ = store.add_event("t", {"t": t, "i": i}, key=f"{t}-{i}")
            with lock:
                out.append(eid)

    threads = [threading.Thread(target=producer, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sorted(out) == list(range(1, 101))
    assert store.count_events() == 100


def test_listeners_get_committed_events_in_id_order_as_stored(store: Store) -> None:
    seen: list[Event] = []
    stop = store.listen_inbox(seen.extend)
    store.add_event("a", {"t": (1, 2)}, key="a")  # a tuple is stored (and handed over) as a list
    store.add_event("a", {"t": 9}, key="a")  # duplicate: not handed over
    store.add_event("b", {}, source="s")
    stop()
    store.add_event("c", {})
    assert [(e.id, e.name, e.payload, e.key, e.source) for e in seen] == [
        (1, "a", {"t": [1, 2]}, "a", None),
        (2, "b", {}, seen[1].key, "s"),
    ]
    assert seen[1].key and seen[1].key.startswith("auto:")
    assert [e.payload for e in store.pending_events()][:1] == [{"t": [1, 2]}]


def test_a_closed_store_refuses_new_events(tmp_path: Path) -> None:
    s = Store(f"sqlite:///{tmp_path / 'c.db'}")
    s.add_event("x", {})
    s.close()
    with pytest.raises(RuntimeError, match="closed"):
        s.add_event("y", {})


def test_wal_is_checkpointed_by_the_store_not_by_commits(tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    s = Store(f"sqlite:///{db}")
    try:
        with s.engine.connect() as conn:  # the commit path never checkpoints
            assert conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == 0
        before = db.stat().st_size
        for i in range(300):  # > KICK_EVERY commits, ~4 WAL pages each
            s.add_event("fill", {"i": i, "pad": "x" * 200})
        # only a checkpoint copies pages from the WAL into the database file
        end = time.monotonic() + 10
        while db.stat().st_size <= before and time.monotonic() < end:
            time.sleep(0.02)
        assert db.stat().st_size > before, "the checkpointer thread never copied the WAL back"
    finally:
        s.close()


async def test_loop_falls_back_to_the_table_when_the_memory_queue_overflows(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime_mod, "MAX_FRESH", 2)
    reads: list[int] = []
    real_pending = store.pending_events

    def counted(after_id: int = 0, limit: int = 100) -> list[Event]:
        reads.append(after_id)
        return real_pending(after_id, limit)

    monkeypatch.setattr(store, "pending_events", counted)
    seen: list[int] = []
    release = threading.Event()
    a = Agent("overflow")

    @a.actuator("note")
    def note(ctx, args):  # type: ignore[no-untyped-def]
        assert ctx.event is not None
        release.wait(10)  # hold the loop on the first event while the rest arrive
        seen.append(ctx.event.payload["i"])
        return {}

    a.strategy("all", event="tick", constraint="True", actions=[Action("note")])
    async with running(a, store) as c:
        for i in range(30):
            r = await c.post("/events", json={"name": "tick", "payload": {"i": i}})
            assert r.status_code == 202
        release.set()
        await drained(c)
    assert seen == list(range(30))  # each once, in order, although most came back from the table
    assert any(after > 0 for after in reads), reads  # the overflow made the loop read past its cursor


@pytest.mark.parametrize("where", ["file", "memory"])
def test_done_marks_go_through_the_writer_in_order_with_inserts(tmp_path: Path, where: str) -> None:
    # file: the sqlite3 driver path; memory: the SQLAlchemy Core path (any other database)
    s = Store(f"sqlite:///{tmp_path / 'd.db'}" if where == "file" else "sqlite://")
    try:
        first = s.submit_event("a", {}, key="a")
        done = s.submit_done(1, 42.0)  # queued behind the insert it refers to
        second = s.submit_event("b", {}, key="b")
        assert first.result(10) == (1, False) and done.result(10) == (1, False)
        assert second.result(10) == (2, False)
        assert [e.id for e in s.pending_events()] == [2]
        row = s.list_events(status="done")[0]
        assert (row["id"], row["processed_at"]) == (1, 42.0)
    finally:
        s.close()
