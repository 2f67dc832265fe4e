"""Tracker: records every prediction (exactly once) and tells the Checker when a window is ready.

The replicas POST their prediction records (inputs, outputs, model version, latency) to this agent's
`/predictions`; whoever learns the TRUE labels POSTs them later, by request_id, to its `/feedback`
(scanflow.tracking.feedback_api), where retraining agents look them up. The `flush` sensor writes new
records to MLflow as Parquet batches (advancing a watermark; crash-safe) and emits
`predictions.logged` with `count_since_check`, the records flushed since it last announced a full
window; the workflow's strategy `check-drift` then calls the Checker's `check_drift`.
Run: `scanflow agent run scanflow.standard.tracker:agent --port 8001 --peer checker=http://127.0.0.1:8002`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter

from scanflow.agent import Agent, Context
from scanflow.agentkit.env import drift_window, quick
from scanflow.settings import Settings
from scanflow.tracking import monitoring
from scanflow.tracking.api import MAX_BODY_BYTES, predictions_router
from scanflow.tracking.feedback import FeedbackLog
from scanflow.tracking.feedback_api import feedback_router
from scanflow.tracking.predictions import AppendResult, LogStats, PredictionLog, PredictionRecord
from scanflow.tracking.record_ids import RECORD_KEY_ENV, parse_key

# the replicas' batches (up to the router's 8 MiB) must pass the app's body limit (1 MiB by default)
agent = Agent("tracker", role="tracker", description="records predictions; announces windows to check",
              max_body_bytes=MAX_BODY_BYTES, settings_keys=("service", "window", "quick_window"),
              needs_workflow=True)


class _Log:
    """The prediction log, opened at startup (building the app must not create databases)."""

    log: PredictionLog | None = None

    def _get(self) -> PredictionLog:
        if self.log is None:
            raise RuntimeError("the prediction log is not open yet (agent starting)")
        return self.log

    def append(self, records: list[PredictionRecord]) -> AppendResult:
        return self._get().append(records)

    def stats(self) -> LogStats:
        return self._get().stats()


class _Feedback:
    """The feedback log, opened at startup like the prediction log; the router calls through this."""

    log: FeedbackLog | None = None

    def __getattr__(self, name: str) -> Any:  # append / since / lookup / stats of the open log
        if self.log is None:
            raise RuntimeError("the feedback log is not open yet (agent starting)")
        return getattr(self.log, name)


@agent.routes
def prediction_routes(settings: Settings, resources: dict[str, Any]) -> APIRouter:
    """/predictions and /feedback over this app's logs (opened by `open_log`), signed with its key."""
    record_key = (parse_key(settings.record_key.get_secret_value(), RECORD_KEY_ENV)
                  if settings.record_key is not None else None)
    log, feedback = resources.setdefault("log", _Log()), resources.setdefault("feedback", _Feedback())
    router = APIRouter()
    router.include_router(predictions_router(log, settings.token, record_key=record_key))
    router.include_router(feedback_router(feedback, settings.token))
    return router


@agent.on_startup
def open_log(ctx: Context) -> None:
    log, feedback = ctx.resources.setdefault("log", _Log()), ctx.resources.setdefault("feedback", _Feedback())
    log.log = PredictionLog(ctx.settings.store_url_for(f"{ctx.name}-predictions"), name=ctx.workflow.name,
                            retention_s=ctx.settings.prediction_retention_s)
    feedback.log = FeedbackLog(ctx.settings.store_url_for(f"{ctx.name}-feedback"))
    if log.log.run_id:  # the predictions run shows Running while a Tracker writes it
        monitoring.safe(ctx.state, "resume the predictions run", monitoring.set_run_status, log.log.run_id, "RUNNING")


@agent.on_shutdown
def close_log(ctx: Context) -> None:
    log, feedback = ctx.resources.get("log"), ctx.resources.get("feedback")
    if log is not None and log.log is not None:
        run_id = log.log.run_id
        log.log.close()  # first: a slow MLflow must not keep the durable log open until a SIGKILL
        if run_id:  # ... and Finished once none does
            monitoring.safe(ctx.state, "end the predictions run", monitoring.set_run_status, run_id, "FINISHED")
    if feedback is not None and feedback.log is not None:
        feedback.log.close()


@agent.sensor(every=1.0, emits=("predictions.logged",))
async def flush(ctx: Context) -> list[tuple[str, dict[str, Any]]]:
    """Flush new records to MLflow; announce them with the count since the last full window."""
    log = ctx.resources["log"]._get()
    result = await asyncio.to_thread(log.flush_to_mlflow, ctx.workflow.name)
    if not result.records:
        return []
    window = drift_window(ctx.spec, quick())
    checked = int(ctx.state.get("checked_seq", 0))
    count = result.watermark - checked
    if count >= window:
        ctx.state["checked_seq"] = result.watermark  # this event asks for a check of these records
    return [("predictions.logged", {
        "count_since_check": count, "window": window, "records": result.records,
        "watermark": result.watermark, "run_id": result.run_id,
    })]
