"""The durable store: inbox dedup and order, decisions with states in one go, action rows, persistence."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from scanflow.agent.engine import Decision, Intent, StrategyState
from scanflow.agent.store import Store
from scanflow.agent.types import Action


def test_sqlite_runs_in_wal_mode_with_a_busy_timeout(store: Store) -> None:
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000


def test_inbox_deduplicates_by_key_and_keeps_arrival_order(store: Store) -> None:
    a, dup_a = store.add_event("x", {"n": 1}, key="k1", now=1.0)
    b, _ = store.add_event("y", {"n": 2}, now=2.0)
    again, dup_again = store.add_event("x", {"n": 999}, key="k1", now=3.0)
    assert (dup_a, dup_again) == (False, True)
    assert again == a and b > a
    pending = store.pending_events()
    assert [e.id for e in pending] == [a, b]
    assert pending[0].payload == {"n": 1}  # the duplicate did not overwrite the first payload
    assert store.pending_events(after_id=a)[0].id == b


def test_record_plan_and_intents_for(store: Store) -> None:
    eid, _ = store.add_event("drift.x", {}, key="e")
    assert store.intents_for(eid) is None  # never decided
    intent = Intent("s:1:0", "s", eid, 0, Action("plan", None, {"a": 1}))
    fired = Decision(eid, "drift.x", "s", "True", "fired", "fired", {"now": 1}, (intent,), 1.0)
    skipped = Decision(eid, "drift.x", "t", "False", "skipped", "false", {}, (), 1.0)
    store.record_plan(eid, [fired, skipped], {"s": StrategyState(last_fired=1.0, last_event_id=eid)})
    assert store.intents_for(eid) == [intent]
    assert store.strategy_states()["s"].last_fired == 1.0
    other, _ = store.add_event("nothing", {})
    store.record_plan(other, [], {})
    assert store.intents_for(other) == []  # decided: nothing to do (a marker row, hidden from listings)
    assert {d["strategy"] for d in store.list_decisions()} == {"s", "t"}
    assert [d["strategy"] for d in store.list_decisions(strategy="t")] == ["t"]


def test_decisions_page_back_by_id(store: Store) -> None:
    for n in range(5):
        eid, _ = store.add_event("e", {}, key=f"e{n}")
        store.record_plan(eid, [Decision(eid, "e", f"s{n}", "True", "fired", "fired", {}, (), float(n))], {})
    first = store.list_decisions(limit=2)
    assert [d["strategy"] for d in first] == ["s4", "s3"]  # newest first
    second = store.list_decisions(limit=2, before_id=first[-1]["id"])
    assert [d["strategy"] for d in second] == ["s2", "s1"]
    assert [d["strategy"] for d in store.list_decisions(limit=9, before_id=second[-1]["id"])] == ["s0"]


def test_action_lifecycle_and_last_successes(store: Store) -> None:
    assert store.get_action("k") is None
    assert store.start_action("k", "scale", "executor", {"n": 2}, 5, now=10.0) == 1
    assert store.get_action("k").status == "started"  # type: ignore[union-attr]
    assert store.start_action("k", "scale", "executor", {"n": 2}, 5, now=11.0) == 2  # retried after a crash
    store.finish_action("k", "succeeded", {"ok": True}, None, now=12.0)
    rec = store.get_action("k")
    assert rec is not None and (rec.status, rec.result, rec.attempts) == ("succeeded", {"ok": True}, 2)
    assert store.last_successes() == {"scale": 12.0, "executor.scale": 12.0}


def test_finish_event_attaches_outcomes(store: Store) -> None:
    eid, _ = store.add_event("e", {})
    intent = Intent("s:1:0", "s", eid, 0, Action("plan"))
    store.record_plan(eid, [Decision(eid, "e", "s", "True", "fired", "fired", {}, (intent,), 0.0)], {})
    store.finish_event(eid, {"s:1:0": {"status": "ok"}}, now=5.0)
    assert store.pending_events() == []
    assert store.list_events(status="done")[0]["processed_at"] == 5.0
    assert store.list_decisions()[0]["outcomes"] == {"s:1:0": {"status": "ok"}}


def test_everything_survives_reopening_the_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    s1 = Store(url)
    s1.add_event("x", {"v": 1}, key="k")
    s1.put("agent_state", {"count": 3})
    s1.close()
    s2 = Store(url)
    try:
        assert [e.key for e in s2.pending_events()] == ["k"]
        assert s2.get("agent_state") == {"count": 3}
        assert s2.get("missing", {"d": 1}) == {"d": 1}
    finally:
        s2.close()


def test_any_sqlalchemy_url_works_in_memory() -> None:
    s = Store("sqlite://")
    try:
        eid, _ = s.add_event("x", {})
        assert s.count_events("pending") == 1
        with s.engine.connect() as conn:
            assert conn.execute(sa.text("select count(*) from events")).scalar() == 1
        assert eid == 1
    finally:
        s.close()


def test_only_one_running_agent_may_own_a_store_file(tmp_path: Path) -> None:
    import pytest

    from scanflow.agent.store_owner import StoreBusyError

    url = f"sqlite:///{tmp_path / 'owned.db'}"
    first, second = Store(url), Store(url)
    try:
        first.claim()
        first.claim()  # idempotent for its owner
        with pytest.raises(StoreBusyError, match="another running agent"):
            second.claim()
        first.release()
        second.claim()  # free again once released (a dead owner releases it too)
    finally:
        first.close()
        second.close()


def test_a_sqlite_file_in_a_directory_not_yet_created_is_opened(tmp_path: Path) -> None:
    """A pod's fresh emptyDir at /tmp has no /tmp/scanflow: the store creates it instead of crash-looping."""
    url = f"sqlite:///{tmp_path / 'fresh' / 'home' / 'agent.db'}"
    s = Store(url)
    try:
        assert (tmp_path / "fresh" / "home" / "agent.db").exists()
    finally:
        s.close()
