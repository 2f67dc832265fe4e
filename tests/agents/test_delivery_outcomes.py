"""A delivery's ledger: records filed by model, mirrors paired with the request they copy, labels scored
once, rows without a label dropped in time, the figures the Planner reads."""

from __future__ import annotations

import json
from types import SimpleNamespace

from scanflow.agentkit import delivery_outcomes as do
from scanflow.agentkit.delivery_outcomes import Ledger


def rec(rid: str, service: str, outputs: list[object], ts: float, client: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(request_id=rid, service=service, outputs=outputs, ts=ts, client_request_id=client)


def test_mirrors_pair_with_the_champion_row_canary_rows_stand_alone_and_labels_score_once() -> None:
    ledger = Ledger(delivery="http://c:1@100", watermark=0, since=100.0, canary_since=102.5)
    do.ingest(ledger, [
        rec("old", "digits", [1], ts=99.0),  # before the delivery: not its row
        rec("c1", "digits", [3], ts=101.0), rec("m1", "digits-challenger", [3], ts=101.5, client="c1"),
        rec("c2", "digits", [4], ts=102.0), rec("m2", "digits-challenger", [5], ts=102.5, client="c2"),
        rec("c3", "digits", [7], ts=103.0),  # no mirror, answered in the canary stage: the champion's own row
        rec("c0", "digits", [7], ts=100.5),  # no mirror, before the canary: no unpaired evidence
        rec("k1", "digits-challenger", [8], ts=104.0, client="client-own-id"),  # canary: answered a client
        rec("x", "other-service", [0], ts=104.0),
    ], "digits-challenger", {"digits", "digits-backup"})
    assert set(ledger.champion) == {"c0", "c1", "c2", "c3"} and set(ledger.challenger) == {"m1", "m2", "k1"}
    # champion rows wait for their mirror; the canary row is asked for at once, mirrors never (no client saw them)
    assert do.to_look_up(ledger, now=105.0) == ["k1"]
    assert do.to_look_up(ledger, now=113.5) == ["k1", "c0", "c1", "c2", "c3"]  # the longest due first
    assert do.to_look_up(ledger, now=113.5, limit=2) == ["k1", "c0"]
    do.apply_labels(ledger, {"c0": [0], "c1": [3], "c2": ["4"], "c3": [0], "k1": [8.0]}, "classification", now=113.5)
    # c1: both right (0); c2: champion right, challenger wrong (-1); c3 alone, wrong; k1 alone, right
    assert ledger.paired == [2, -1.0, 1.0]
    assert ledger.champion_sums == [1, 0.0, 0.0] and ledger.challenger_sums == [1, 1.0, 1.0]
    assert ledger.champion == {} and ledger.challenger == {}
    # the ledger survives the Checker's state (JSON) and a label arriving twice scores nothing twice
    back = Ledger.from_json(json.loads(json.dumps(ledger.to_json())))
    do.apply_labels(back, {"c1": [3]}, "classification", now=113.0)
    assert back.paired == [2, -1.0, 1.0]


def test_a_row_still_waiting_is_asked_again_after_twice_its_age() -> None:
    ledger = Ledger(delivery="d", watermark=0, since=0.0)
    do.ingest(ledger, [rec("c1", "digits", [1], ts=0.0)], "digits-challenger", {"digits"})
    assert do.to_look_up(ledger, now=10.0) == ["c1"]
    do.asked(ledger, ["c1"], now=10.0)  # no label yet
    assert do.to_look_up(ledger, now=19.0) == [] and do.to_look_up(ledger, now=20.0) == ["c1"]
    do.asked(ledger, ["c1"], now=20.0)
    assert do.to_look_up(ledger, now=39.0) == [] and do.to_look_up(ledger, now=40.0) == ["c1"]


def test_rows_without_labels_are_dropped_in_time_and_bad_labels_are_no_evidence() -> None:
    ledger = Ledger(delivery="d", watermark=0, since=0.0, canary_since=0.0)
    do.ingest(ledger, [rec("c1", "digits", [1, 2], ts=10.0), rec("c2", "digits", [1], ts=10.0),
                       rec("c3", "digits", [1], ts=500.0)], "digits-challenger", {"digits"})
    do.apply_labels(ledger, {"c1": [1]}, "classification", now=200.0, max_age_s=100.0)  # one label for two rows
    assert ledger.champion_sums == [0, 0.0, 0.0]
    assert set(ledger.champion) == {"c3"} and ledger.dropped == 1  # c2 never labelled, too old now


def test_figures_join_the_sums_and_the_gateways_view() -> None:
    ledger = Ledger(delivery="d", watermark=0, since=0.0, paired=[10, 1.0, 3.0])
    fig = do.figures(ledger, {"requests": 50, "failed": 2, "timed": 48, "p99_ms": 12.5, "agreement": 0.9}, 100.0)
    assert (fig.paired.n, fig.requests, fig.errors, fig.timed, fig.p99_ms, fig.slo_p99_ms, fig.agreement) == (
        10, 50, 2, 48, 12.5, 100.0, 0.9)
