"""The rows a retrain and its promotion read from the prediction and feedback logs.

Who calls: the Executor's `retrain` (`drift_rows`: the plan's critical requests joined with their
feedback labels, and the recent inputs) and `evaluate_and_promote` (`log_serving_reference`: what the
new model will serve, logged in its run before the alias moves). Kept apart from the actuators
(scanflow/standard/executor.py) because they read logs, not the platform.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from scanflow import messages
from scanflow.agent import Context, PermanentError
from scanflow.agentkit.delivery_outcomes import declared_only


def _setting(ctx: Context, key: str, default: Any) -> Any:
    return ctx.spec.settings.get(key, default)


@dataclasses.dataclass(frozen=True)
class DriftRows:
    """What the prediction log and the feedback log hold about a plan's drift."""

    x_labelled: np.ndarray  # rows of the plan's critical requests that feedback labelled
    y_labelled: np.ndarray  # their true labels (classes) or targets (regression)
    x_recent: np.ndarray  # the most recent inputs since the drift (unlabelled): what the new model will serve
    critical_requests: int
    labelled_requests: int


def drift_rows(ctx: Context, critical_ids: set[str], from_seq: int, task: str) -> DriftRows:
    """Read the prediction log after `from_seq` (the plan's first drifted window) and join the critical
    requests with their feedback labels (the Tracker's feedback log, by request id). Labels come only from
    feedback: never from the model's own outputs, never from inside a predict request."""
    from scanflow.tracking.feedback_client import lookup_labels
    from scanflow.tracking.predictions import prediction_run_id, read_since

    wf = ctx.workflow
    run_id = prediction_run_id(wf.name, wf.name)
    if run_id is None:
        raise PermanentError("no prediction log in MLflow yet: nothing to retrain on")
    batch = declared_only(read_since(run_id, max(0, from_seq)), {s.name for s in wf.services})
    critical = [r for r in batch.records if r.request_id in critical_ids]
    labels = lookup_labels(ctx, [r.request_id for r in critical])
    xs: list[list[float]] = []
    ys: list[Any] = []
    for r in critical:
        got = labels.get(r.request_id)
        if got is not None and len(got) == len(r.inputs):
            xs.extend(r.inputs)
            ys.extend(got)
    recent = batch.inputs()[-int(_setting(ctx, "reference_rows", 2000)):]
    y = np.asarray(ys, dtype=np.float64 if task == "regression" else None)
    if task != "regression" and y.dtype.kind == "f" and len(y) and np.all(np.mod(y, 1) == 0):
        y = y.astype(np.int64)
    width = recent.shape[1] if recent.ndim == 2 and recent.size else 0
    return DriftRows(np.asarray(xs, np.float32).reshape(len(xs), width), y, recent,
                     len(critical), sum(r.request_id in labels for r in critical))


MIN_SERVING_ROWS = 500  # fresh rows after the plan's windows that stand for what the new model serves
MIN_FRESH_ROWS = 100  # after the wait, fewer fresh rows than this: the plan's own rows stand in
SERVING_WAIT_S = 60.0  # how long evaluate_and_promote waits for them before it makes do with fewer


def serving_inputs(ctx: Context, plan: messages.RetrainPlan, fallback: np.ndarray) -> np.ndarray:
    """The inputs the new champion will serve: the traffic logged after the plan's last drifted window
    (`to_seq`), the most recent `reference_rows` of it, once at least MIN_SERVING_ROWS came in (waiting
    up to `serving_wait_s`, 60 s; the training job usually takes longer than that traffic needs).
    Why not the rows since the first drifted window: that window straddles the drift onset, and a
    reference mixing clean rows into the drifted ones made the refitted detector flag every later window
    of the same drifted traffic (5 of 5 in an S1 e2e run); and a few hundred fresh rows gave a
    calibration too small to hold the false-positive rate (3 of 5 flagged on the tabular example).
    After the wait, any MIN_FRESH_ROWS fresh rows are used alone; with fewer (the traffic nearly
    stopped) the plan's own recent rows (`fallback`) stand in, which may hold some pre-onset rows."""
    from scanflow.tracking.predictions import prediction_run_id, read_since

    wf = ctx.workflow
    keep = int(_setting(ctx, "reference_rows", 2000))
    if plan.to_seq is None:
        return fallback
    deadline = time.monotonic() + float(_setting(ctx, "serving_wait_s", SERVING_WAIT_S))
    fresh = np.zeros((0, 0), np.float32)
    while True:
        run_id = prediction_run_id(wf.name, wf.name)
        got = declared_only(read_since(run_id, plan.to_seq), {s.name for s in wf.services}).inputs() if run_id else fresh
        if got.ndim == 2 and len(got) >= MIN_SERVING_ROWS:
            return got[-keep:]
        if got.ndim == 2 and got.size:
            fresh = got
        if time.monotonic() >= deadline:
            break
        time.sleep(1.0)  # the Tracker flushes to MLflow every second
    return fresh[-keep:] if len(fresh) >= MIN_FRESH_ROWS else fallback


def log_serving_reference(ctx: Context, ref: Any, rec: dict[str, Any], plan: messages.RetrainPlan) -> str | None:
    """Log, in the challenger's run, the reference of what it will serve: the recent drifted inputs
    (`serving_inputs`: the detector's new normal) and the plan's labelled holdout (the next gate's
    clean part; with fewer than the minimum, every labelled row of the plan). Before the alias moves,
    so the Checker never fits the new champion's detector from the job's training rows instead."""
    from scanflow.tracking.reference import MIN_HOLDOUT_ROWS, SERVING_REFERENCE_DIR, log_reference

    if not rec.get("run_id"):
        return None
    with np.load(rec["drift"]) as d, np.load(rec["holdout"]) as h, np.load(rec["train"]) as t:
        x_recent, x_hold, y_hold = d["x"], h["x"], h["y"]
        if len(x_hold) < MIN_HOLDOUT_ROWS:
            x_hold, y_hold = np.concatenate([x_hold, t["x"]]), np.concatenate([y_hold, t["y"]])
    s = ref.schema
    return log_reference(serving_inputs(ctx, plan, x_recent), x_hold, y_hold, task=s.task, kind=s.kind,
                         image_shape=s.image_shape, categorical=s.categorical, feature_names=s.feature_names,
                         run_id=rec["run_id"], artifact_path=SERVING_REFERENCE_DIR)
