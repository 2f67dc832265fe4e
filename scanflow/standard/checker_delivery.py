"""The Checker's delivery check: while the primary service's gateway has a challenger, what each model
did on the rows feedback labelled, for the Planner (`delivery.checked`).

Who calls: the Checker's `check_delivery` sensor (scanflow/standard/checker.py), every few seconds. The
`watch` sensor keeps the gateway's `challenger` (its URL, service, stage and answer counts) in the state;
this reads the prediction log from where it stopped, files each record as the champion's or the
challenger's (scanflow.agentkit.delivery_outcomes), asks the Tracker for the labels of the rows due, and
sends the running sums with the gateway's figures. The rows still waiting for a label are kept in memory
only (a restarted Checker loses them: fewer labelled rows, never wrong ones); the sums and the log
position are in the persisted state, so a restart resumes the delivery's evidence.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from scanflow.agent import Context, PermanentError, TemporaryError
from scanflow.agentkit import delivery_outcomes as outcomes
from scanflow.agentkit.delivery_outcomes import Ledger
from scanflow.agentkit.env import primary_service
from scanflow.messages import DeliveryChecked

log = logging.getLogger(__name__)
CHECK_EVERY_S = 3.0
MAX_LOOKUP = 5000  # request ids asked of the Tracker per check (the rest at the next one)
_TASKS: dict[tuple[str, str], str] = {}  # (model, version) -> "classification" | "regression"


def delivery_key(challenger: dict[str, Any]) -> str:
    """Pure: which delivery a gateway's challenger is: the Executor's id for it, the same on every gateway and
    after a gateway restarts (else its URL and when it was set)."""
    return str(challenger.get("delivery") or f"{challenger.get('url')}@{challenger.get('since')}")


def _task(model: str) -> str:
    """The champion's task, from its reference schema (blocking: MLflow)."""
    from scanflow.tracking.reference import reference_for_version
    from scanflow.tracking.registry import CHAMPION, get_alias_version

    version = get_alias_version(model, CHAMPION)
    if version is None:
        raise TemporaryError(f"no champion of {model!r}", delay_s=5.0)
    if (model, version) not in _TASKS:
        _TASKS[(model, version)] = str(reference_for_version(model, version).schema.task)
    return _TASKS[(model, version)]


def _read(ctx: Context, ledger: Ledger, challenger_service: str) -> None:
    """Blocking: file the records logged since the ledger's watermark."""
    from scanflow.tracking.predictions import prediction_run_id, read_since

    run_id = prediction_run_id(ctx.workflow.name, ctx.workflow.name)
    if run_id is None:
        return
    batch = read_since(run_id, ledger.watermark)
    outcomes.ingest(ledger, batch.records, challenger_service, {s.name for s in ctx.workflow.services})
    ledger.watermark = batch.watermark


def _label(ctx: Context, ledger: Ledger, task: str) -> None:
    """Blocking: score the rows whose labels have arrived (the Tracker's feedback)."""
    from scanflow.tracking.feedback_client import lookup_labels

    now = time.time()
    ids = outcomes.to_look_up(ledger, now, MAX_LOOKUP)
    labels: dict[str, list[Any]] = {}
    if ids and "tracker" in ctx.peers:
        try:
            labels = lookup_labels(ctx, ids)
        except (PermanentError, TemporaryError) as exc:  # no feedback now: the next check asks again
            log.info("delivery check: feedback lookup skipped: %s", exc)
            ids = []
    outcomes.apply_labels(ledger, labels, task, now)
    outcomes.asked(ledger, ids, now)


async def check(ctx: Context, slo_ms: float | None) -> list[tuple[str, dict[str, Any]]]:
    """One delivery check: `delivery.checked` while the gateway has a challenger, nothing otherwise.
    `slo_ms`: the latency SLO the Checker judges now (the challenger's p99 is held against it)."""
    from scanflow.agentkit.detectors import model_name_of

    ch = ctx.state.get("challenger")
    if not ch:  # the ledger stays: a restarted gateway gets the same delivery back (its id) within seconds
        return []
    svc = primary_service(ctx.workflow)
    challenger_service = str(ch.get("service") or f"{svc.name}-challenger")
    key = delivery_key(ch)
    ledger: Ledger | None = ctx.resources.get("delivery_ledger")
    if ledger is None or ledger.delivery != key:
        kept = ctx.state.get("delivery") or {}
        ledger = Ledger.from_json(kept) if kept.get("delivery") == key else Ledger(
            delivery=key, watermark=int(ctx.state.get("watermark", 0)), since=float(ch.get("since") or 0.0))
        ctx.resources["delivery_ledger"] = ledger
    if ch.get("mode") == "canary" and ledger.canary_since is None:
        ledger.canary_since = time.time()
    task = await asyncio.to_thread(_task, model_name_of(ctx.workflow))
    await asyncio.to_thread(_read, ctx, ledger, challenger_service)
    await asyncio.to_thread(_label, ctx, ledger, task)
    ctx.state["delivery"] = ledger.to_json(books=False)
    fig = outcomes.figures(ledger, ch, slo_ms)
    payload = DeliveryChecked.model_validate({
        "service": svc.name, "challenger_service": challenger_service, "delivery": key,
        "mode": ch.get("mode"), "share": float(ch.get("share") or 0.0),
        "paired": fig.paired.__dict__, "challenger": fig.challenger.__dict__, "champion": fig.champion.__dict__,
        "requests": fig.requests, "errors": fig.errors, "timed": fig.timed, "p99_ms": fig.p99_ms,
        "champion_p99_ms": fig.champion_p99_ms, "champion_timed": fig.champion_timed,
        "recent_p99_ms": fig.recent_p99_ms, "recent_timed": fig.recent_timed,
        "champion_recent_p99_ms": fig.champion_recent_p99_ms,
        "slo_p99_ms": fig.slo_p99_ms, "agreement": fig.agreement, "dropped": ledger.dropped,
    }).payload()
    return [("delivery.checked", payload)]
