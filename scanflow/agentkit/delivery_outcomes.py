"""A delivery's live outcomes: each model's labelled rows, from the prediction log and the feedback.

Who calls: the Checker, on every delivery check while the champion's gateway has a challenger
(scanflow.serving.challenger); what it measures becomes the `delivery.checked` figures the Planner
judges (scanflow.policies.delivery). Pure: the Checker does the reading and the lookups
(scanflow/standard/checker_delivery.py).

How the rows are told apart, from what the prediction log holds:
- the challenger's records carry its service's name (the gateway's `challenger.service`);
- a record of the challenger whose client id (`client_request_id`) is a champion record's `request_id`
  is a mirror of that request (shadow): the pair is scored once the champion's row is labelled;
- any other challenger record is one it answered to a client (canary): labelled by its own request id;
- the champion's records answered clients; a row labelled before its mirror was read would be scored
  alone, so a champion record waits `pair_wait_s` (the mirror arrives within a second or two) before its
  label is looked up. A champion row with no mirror counts for the unpaired comparison only when it was
  answered during a canary stage (`canary_since`): both models' own rows then come from the same period,
  so a drift over the delivery's time does not read as a gap between the models.
A row is asked for again while its label has not come, each time after twice its age (10 s, 20 s,
40 s, ...), so lookups stay few however many rows wait. Rows waiting for a label longer than
`max_age_s` are dropped (feedback covers only some requests), and at most `max_pending` records wait at
once, the oldest dropped first: memory stays bounded however long a delivery runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from scanflow.policies.delivery import LiveFigures, OutcomeSums, row_scores

PAIR_WAIT_S = 10.0
MAX_AGE_S = 1800.0
MAX_PENDING = 50_000


@dataclass
class Ledger:
    """One delivery's pending rows and running sums (JSON in the Checker's state between checks)."""

    delivery: str  # which delivery: the challenger's URL and when it was set
    watermark: int  # the prediction log's seq read up to
    since: float  # records before this (wall clock) are not the delivery's
    champion: dict[str, list[Any]] = field(default_factory=dict)  # request_id -> [ts, outputs, next ask]
    challenger: dict[str, list[Any]] = field(default_factory=dict)  # request_id -> [ts, client id, outputs, next ask]
    canary_since: float | None = None  # when a canary stage was first seen: unpaired champion rows count from then
    paired: list[float] = field(default_factory=lambda: [0, 0.0, 0.0])
    challenger_sums: list[float] = field(default_factory=lambda: [0, 0.0, 0.0])
    champion_sums: list[float] = field(default_factory=lambda: [0, 0.0, 0.0])
    dropped: int = 0  # rows that never got a label in time, or pushed out by the bound

    def to_json(self, books: bool = True) -> dict[str, Any]:
        """JSON for a state; `books=False` leaves out the rows waiting for labels (the sums and the log
        position are what a restart needs; the waiting rows can be tens of thousands)."""
        out = dict(self.__dict__)
        if not books:
            out["champion"], out["challenger"] = {}, {}
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Ledger:
        return cls(**dict(data))


def _sums(s: list[float]) -> OutcomeSums:
    return OutcomeSums(int(s[0]), float(s[1]), float(s[2]))


def _add(s: list[float], got: OutcomeSums) -> None:
    s[0], s[1], s[2] = int(s[0]) + got.n, float(s[1]) + got.total, float(s[2]) + got.total_sq


def ingest(ledger: Ledger, records: Iterable[Any], challenger_service: str, champion_services: set[str]) -> None:
    """Pure: file the delivery's new prediction records (objects with request_id, service, outputs, ts,
    client_request_id) as champion or challenger rows."""
    for r in records:
        if float(r.ts) < ledger.since:
            continue
        if r.service == challenger_service:
            ledger.challenger[r.request_id] = [float(r.ts), r.client_request_id, list(r.outputs), float(r.ts)]
        elif r.service in champion_services:
            ledger.champion[r.request_id] = [float(r.ts), list(r.outputs), float(r.ts) + PAIR_WAIT_S]
    _bound(ledger)


def _bound(ledger: Ledger) -> None:
    for book in (ledger.champion, ledger.challenger):
        over = len(book) - MAX_PENDING
        if over > 0:
            for rid in sorted(book, key=lambda k: book[k][0])[:over]:
                del book[rid]
            ledger.dropped += over


def to_look_up(ledger: Ledger, now: float, limit: int | None = None) -> list[str]:
    """Pure: the request ids whose labels to ask the Tracker for now, those due longest first: champion
    rows old enough for their mirror to have been read, and the challenger's rows that a client got (not
    the mirrors: a client never saw their ids)."""
    due = [(row[2], rid) for rid, row in ledger.champion.items() if row[2] <= now]
    due += [(row[3], rid) for rid, row in ledger.challenger.items()
            if row[3] <= now and row[1] not in ledger.champion]
    due.sort()
    return [rid for _, rid in due[:limit]]


def asked(ledger: Ledger, ids: Iterable[str], now: float) -> None:
    """Pure: the rows just asked for that are still waiting are asked again after twice their age."""
    for rid in ids:
        for book, at in ((ledger.champion, 2), (ledger.challenger, 3)):
            row = book.get(rid)
            if row is not None:
                row[at] = now + max(PAIR_WAIT_S, now - float(row[0]))


def apply_labels(ledger: Ledger, labels: Mapping[str, list[Any]], task: str, now: float,
                 max_age_s: float = MAX_AGE_S) -> None:
    """Pure: score the rows that got labels (a pair when the champion's row has a mirror, else the row
    alone for the model that answered it) and drop rows too old to expect one."""
    mirror_of = {c[1]: rid for rid, c in ledger.challenger.items() if c[1] is not None}
    for rid, lab in labels.items():
        if rid in ledger.champion:
            ts, outputs, _ = ledger.champion.pop(rid)
            mirror = mirror_of.get(rid)
            mine = _scores(task, outputs, lab)
            if mine is None:
                continue
            if mirror is not None and mirror in ledger.challenger:
                other = _scores(task, ledger.challenger.pop(mirror)[2], lab)
                if other is not None:
                    _add(ledger.paired, OutcomeSums.of(other - mine))
                    continue
            if ledger.canary_since is not None and ts >= ledger.canary_since:
                _add(ledger.champion_sums, OutcomeSums.of(mine))
        elif rid in ledger.challenger:
            got = _scores(task, ledger.challenger.pop(rid)[2], lab)
            if got is not None:
                _add(ledger.challenger_sums, OutcomeSums.of(got))
    for book in (ledger.champion, ledger.challenger):
        old = [rid for rid, row in book.items() if now - float(row[0]) > max_age_s]
        for rid in old:
            del book[rid]
        ledger.dropped += len(old)


def declared_only(batch: Any, services: set[str]) -> Any:
    """Pure: a prediction batch without the records of services the workflow does not declare (a
    progressive delivery's challenger: in shadow its records repeat the champion's requests, and its
    answers are not the traffic a detector or a retrain reads); the watermark stays the batch's."""
    if all(r.service in services for r in batch.records):
        return batch
    keep = [i for i, r in enumerate(batch.records) if r.service in services]
    return dataclasses.replace(batch, records=[batch.records[i] for i in keep], seqs=[batch.seqs[i] for i in keep],
                               _inputs=None)


def _scores(task: str, outputs: list[Any], labels: list[Any]) -> Any:
    """Per-row scores, or None when the labels do not match the outputs row for row (a bad feedback
    record: not evidence either way)."""
    if not isinstance(labels, list) or len(labels) != len(outputs):
        return None
    try:
        return row_scores(task, outputs, labels)
    except (TypeError, ValueError):
        return None


def figures(ledger: Ledger, gateway_challenger: Mapping[str, Any], slo_p99_ms: float | None) -> LiveFigures:
    """Pure: what the Planner judges: the ledger's sums and the gateway's view of the challenger."""
    return LiveFigures(
        paired=_sums(ledger.paired), challenger=_sums(ledger.challenger_sums), champion=_sums(ledger.champion_sums),
        requests=int(gateway_challenger.get("requests") or 0), errors=int(gateway_challenger.get("failed") or 0),
        timed=int(gateway_challenger.get("timed") or 0), p99_ms=gateway_challenger.get("p99_ms"),
        champion_p99_ms=gateway_challenger.get("champion_p99_ms"),
        champion_timed=int(gateway_challenger.get("champion_timed") or 0),
        recent_p99_ms=gateway_challenger.get("recent_p99_ms"),
        recent_timed=int(gateway_challenger.get("recent_timed") or 0),
        champion_recent_p99_ms=gateway_challenger.get("champion_recent_p99_ms"),
        slo_p99_ms=slo_p99_ms, agreement=gateway_challenger.get("agreement"))
