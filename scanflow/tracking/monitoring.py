"""What the MLflow UI shows of the agents' work: monitoring runs, the retrain link chain, run states.

The agents decide in their own stores; this module writes a readable copy of those decisions into
MLflow, where people look: one **monitoring run** per service (`monitor-<service>`, found again by
its tags after a restart) holding the drift checks, the latency checks and the Planner's and
Executor's decisions as metric histories; and the tags and descriptions that link a retrain from the
drift check that caused it to the model version it produced and the swap that put it in service.

Pure functions build names, tags and metrics (the retrain chain's sentences and plan tags are
scanflow.tracking.run_notes); the few blocking functions do the MLflow calls. Two promises to the agents:
- a write never fails an agent's action: the blocking calls are wrapped (`safe`) or queued
  (`MonitorWriter`, a background thread, so a slow MLflow never holds up a sensor tick);
- a failed write is never silently dropped: each is logged and counted in the agent's state
  (`mlflow_failures` for direct writes, `mlflow_monitor` for the writer's queue).
Who calls: the four agents (scanflow/standard/*.py), the bootstrap, the registry (experiment kind).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from scanflow.tracking.latest import LATEST
from scanflow.tracking.run_notes import (
    bootstrap_run_name,
    clip,
    finite_number,
    plan_tags,
    retrain_note,
    retrain_run_name,
    version_description,
)

log = logging.getLogger(__name__)

NOTE_TAG = "mlflow.note.content"  # the run's (or experiment's) description in the UI

KIND_TAG = "scanflow.kind"
MONITOR_KIND = "monitoring"
RETIRED_KIND = "monitoring-duplicate"  # a monitoring run two agents created at once: the younger one
WORKFLOW_TAG = "scanflow.workflow"
SERVICE_TAG = "scanflow.service"
HOME_TAG = "scanflow.stack_home"

TRAINING_RUN_TAG = "scanflow.training_run_id"
PROMOTED_TAG = "scanflow.promoted"
SWAPPED_TAG = "scanflow.swapped"
ROLLED_BACK_TAG = "scanflow.rolled_back"  # on a model version a progressive delivery rolled back: why


# -- names and tags (pure) -----------------------------------------------------------------------
@dataclass(frozen=True)
class MonitorTarget:
    """Which monitoring run: the workflow's experiment, the service, the stack home that owns it.

    The home tells two stacks on one MLflow apart; all agents of one stack share it (embedded: the
    stack's home, SCANFLOW_STACK_HOME; Kubernetes: every agent's SCANFLOW_HOME), so they all find the
    same run."""

    experiment: str
    service: str
    home: str


STACK_HOME_ENV = "SCANFLOW_STACK_HOME"  # the embedded stack's home; each agent's SCANFLOW_HOME is under it


def monitor_target(workflow: str, service: str, home: str | Path) -> MonitorTarget:
    """The target of the stack an agent with home `home` belongs to: SCANFLOW_STACK_HOME when set (the
    embedded stack gives each agent a home of its own, `<stack>/agents/<role>`, and names the stack's in
    this variable), else `home`. Resolved to an absolute path, so agents started from other directories
    agree."""
    return MonitorTarget(workflow, service, str(Path(os.environ.get(STACK_HOME_ENV) or home).resolve()))


def monitor_run_name(service: str) -> str:
    return f"monitor-{service}"


def monitor_tags(target: MonitorTarget) -> dict[str, str]:
    return {KIND_TAG: MONITOR_KIND, WORKFLOW_TAG: target.experiment, SERVICE_TAG: target.service,
            HOME_TAG: target.home,
            NOTE_TAG: (f"Monitoring of service {target.service} in workflow {target.experiment}. The Checker "
                       "logs each drift check (step = the last prediction seq it read) with its accuracy "
                       "estimate, and each latency check with the replicas' CPU use; the Planner logs its decisions (a retrain decision at the step of the drift "
                       "check it answered); the Executor logs its actions (step = the plan id).")}


def _literal(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def monitor_filter(target: MonitorTarget) -> str:
    """The MLflow search filter that finds a target's monitoring run."""
    return (f"tags.`{KIND_TAG}` = '{MONITOR_KIND}' and tags.`{SERVICE_TAG}` = {_literal(target.service)} "
            f"and tags.`{HOME_TAG}` = {_literal(target.home)}")


def _metrics(pairs: Iterable[tuple[str, Any]]) -> dict[str, float]:
    out = {}
    for key, value in pairs:
        f = finite_number(value)
        if f is not None:
            out[key] = f
    return out


def drift_metrics(payload: Mapping[str, Any]) -> tuple[dict[str, float], int]:
    """(metrics, step) of one `drift.checked` payload: score, p-value, drift rate, window size, the
    verdict as 0/1 and the model version it judged. Step: the last prediction seq the check read (0
    when the payload has none), so a plan's seq range points straight at its checks."""
    step = finite_number(payload.get("to_seq"))
    return _metrics([("drift/score", payload.get("score")), ("drift/p_value", payload.get("p_value")),
                     ("drift/drift_rate", payload.get("drift_rate")), ("drift/window_size", payload.get("n")),
                     ("drift/flag", bool(payload.get("drift"))),
                     ("serving/model_version", payload.get("detector_version"))]), int(step or 0)


def next_step(state: dict[str, Any], series: str) -> int:
    """The next step of a counter-stepped series (latency checks, scaling decisions), kept in the
    agent's persisted state so a restarted agent continues the history instead of overwriting it."""
    steps = state.setdefault("monitor_steps", {})
    steps[series] = int(steps.get(series, 0)) + 1
    return int(steps[series])


def latency_metrics(payload: Mapping[str, Any], percentile: float) -> dict[str, float]:
    """Metrics of one `latency.checked` payload: the SLO percentile latency (left out when no request
    completed), the SLO, the breach as 0/1 and the replicas the gateway saw."""
    return _metrics([(f"latency/p{percentile:g}_ms", payload.get("latency_ms")),
                     ("latency/slo_ms", payload.get("slo_ms")), ("latency/breached", payload.get("breached")),
                     ("latency/replicas", payload.get("replicas")),
                     ("latency/healthy_replicas", payload.get("healthy_replicas")),
                     ("latency/in_flight", payload.get("in_flight"))])


def resource_metrics(payload: Mapping[str, Any]) -> dict[str, float]:
    """The replicas' CPU in one `latency.checked` payload (its observations, scanflow.agentkit.observe):
    cores used by all the service's replicas together over the interval, the largest replica CPU limit,
    their use of their limits (0-1), the largest share of CFS periods throttled (when a limit is set) and
    the largest thread pool. Each is left out when it was not measured this tick (the first scrape, a
    replica that did not answer)."""
    return _metrics([("resources/cpu_used_cores", payload.get("cpu_used_cores")),
                     ("resources/cpu_limit_cores", payload.get("cpu_limit_cores")),
                     ("resources/cpu_utilization", payload.get("cpu_utilization")),
                     ("resources/throttled_ratio", payload.get("throttled_ratio")),
                     ("resources/threads", payload.get("threads"))])


def retrain_decision_metrics(retrain: bool, windows: Iterable[bool], critical_points: int,
                             labelled: int | None, cusum: float | None = None,
                             threshold: float | None = None) -> dict[str, float]:
    """The Planner's retrain decision on one drift check: retrain 0/1, drifted windows among the last
    m, critical points gathered, how many feedback labelled (when it counted them), and the drift CUSUM
    beside its alarm threshold (the retrain rule "cusum")."""
    return _metrics([("plan/retrain", retrain), ("plan/drifted_windows", sum(bool(w) for w in windows)),
                     ("plan/critical_points", critical_points), ("plan/labelled", labelled),
                     ("plan/drift_cusum", cusum), ("plan/drift_cusum_threshold", threshold)])


# -- failure accounting --------------------------------------------------------------------------
FAILURES_KEY = "mlflow_failures"
MONITOR_KEY = "mlflow_monitor"
T = TypeVar("T")


def safe(state: dict[str, Any] | None, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
    """fn(*args, **kwargs), or None when it raises: logged, and counted in `state[FAILURES_KEY]`
    (`count` and the `last` error), so an MLflow outage never fails the agent's action and never
    goes unnoticed (the count is in the agent's state, which GET /status shows). Blocking."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - any MLflow or network error: record it, go on
        log.warning("MLflow write failed (%s): %s: %s", what, type(exc).__name__, exc)
        if state is not None:
            prev = state.get(FAILURES_KEY) or {}
            state[FAILURES_KEY] = {"count": int(prev.get("count", 0)) + 1,
                                   "last": f"{what}: {type(exc).__name__}: {str(exc)[:300]}"}
        return None


# -- blocking MLflow calls -----------------------------------------------------------------------
def _client() -> Any:
    from mlflow import MlflowClient

    return MlflowClient()


_runs: dict[MonitorTarget, str] = {}
_runs_lock = threading.Lock()


def ensure_monitor_run(target: MonitorTarget) -> str:
    """The id of the target's monitoring run: cached, else found by its tags, else created. Blocking.

    Race-safe enough for agents that start together: after creating one, the oldest run with the tags
    wins and a younger duplicate created here is retired (its kind tag changed, so no search finds it,
    and ended): every writer settles on the same run. Retired, not deleted: only the operator's MLflow
    login deletes runs (scanflow.tracking.mlflow_routes)."""
    with _runs_lock:
        known = _runs.get(target)
    if known is not None:
        return known
    from scanflow.tracking.registry import ensure_experiment

    client = _client()
    exp_id = ensure_experiment(target.experiment)

    def oldest() -> str | None:
        found = client.search_runs([exp_id], monitor_filter(target),
                                   order_by=["attributes.start_time ASC", "attributes.run_id ASC"], max_results=1)
        return str(found[0].info.run_id) if found else None

    run_id = oldest()
    if run_id is None:
        created = str(client.create_run(exp_id, run_name=monitor_run_name(target.service),
                                        tags=monitor_tags(target)).info.run_id)
        run_id = oldest() or created
        if run_id != created:
            client.set_tag(created, KIND_TAG, RETIRED_KIND)
            client.set_tag(created, NOTE_TAG, f"A duplicate of monitoring run {run_id}, created by an agent that "
                           "started at the same time; unused.")
            client.set_terminated(created, "KILLED")
    with _runs_lock:
        _runs[target] = run_id
    return run_id


def forget_monitor_runs() -> None:
    """Drop the cached run ids (tests; or after the runs were deleted by hand)."""
    with _runs_lock:
        _runs.clear()


def log_metrics(run_id: str, metrics: Mapping[str, float], step: int, ts_ms: int | None = None) -> None:
    """One batch of metrics at `step`. Blocking."""
    from mlflow.entities import Metric

    if not metrics:
        return
    ts = int(time.time() * 1000) if ts_ms is None else ts_ms
    _client().log_batch(run_id, metrics=[Metric(k, float(v), ts, int(step)) for k, v in metrics.items()])


def set_run_status(run_id: str, status: str) -> None:
    """FINISHED ends a run (with its end time); RUNNING resumes it. Blocking."""
    client = _client()
    if status == "RUNNING":
        client.update_run(run_id, status="RUNNING")
    else:
        client.set_terminated(run_id, status)


def set_monitor_status(targets: Iterable[MonitorTarget], status: str) -> list[str]:
    """End or resume the targets' monitoring runs (created when missing). Blocking; returns the run ids."""
    ids = []
    for t in targets:
        run_id = ensure_monitor_run(t)
        set_run_status(run_id, status)
        ids.append(run_id)
    return ids


def tag_run(run_id: str, tags: Mapping[str, str], name: str | None = None) -> None:
    """Set tags (and the run's name) on a run. Blocking."""
    from mlflow.entities import RunTag

    client = _client()
    if name:
        client.update_run(run_id, name=name)
    client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])


def describe_version(model: str, version: str, description: str, tags: Mapping[str, str] | None = None) -> None:
    """Set a model version's description (and tags). Blocking."""
    client = _client()
    client.update_model_version(model, version, description=description)
    for k, v in (tags or {}).items():
        client.set_model_version_tag(model, version, k, str(v))


def name_bootstrap_run(model: str, version: str) -> str | None:
    """Give the run that trained `model` version `version` at bootstrap a name and a description.
    Done after the job, whatever run it opened itself. Blocking; returns the run id."""
    client = _client()
    run_id = client.get_model_version(model, version).run_id
    if not run_id:
        return None
    tag_run(run_id, {KIND_TAG: "training", NOTE_TAG: f"First training of {model} (version {version}), run by the "
                     "bootstrap before the agents started; this version became the first champion."},
            name=bootstrap_run_name(model, version))
    return str(run_id)


# -- the background writer -----------------------------------------------------------------------
@dataclass
class _Item:
    target: MonitorTarget
    metrics: dict[str, float]
    step: int
    ts_ms: int


class MonitorWriter:
    """Metrics for monitoring runs, written by one background thread from a bounded queue.

    Why a thread: the Checker's watch sensor ticks every second and must not wait on MLflow (a busy
    server answers in seconds; one that is down makes the client retry for minutes). A full queue
    drops the new item; every drop and failed write is counted (`counts()`, copied into the agent's
    state at each submit) and logged."""

    def __init__(self, maxsize: int = 1000) -> None:
        self._q: queue.Queue[_Item] = queue.Queue(maxsize)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._pending = 0
        self._thread: threading.Thread | None = None
        self._counts: dict[str, Any] = {"written": 0, "failed": 0, "dropped": 0, "last_error": None}

    def counts(self) -> dict[str, Any]:
        with self._lock:
            return {**self._counts, "queued": self._pending}

    def submit(self, state: dict[str, Any] | None, target: MonitorTarget, metrics: Mapping[str, float],
               step: int) -> None:
        """Queue metrics for the target's monitoring run; never blocks. Copies the counts into `state`.
        The values also become the agent's Prometheus gauges (scanflow.tracking.latest) right away."""
        if metrics:
            LATEST.record(target.experiment, target.service, metrics)
            item = _Item(target, dict(metrics), int(step), int(time.time() * 1000))
            with self._lock:
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(target=self._run, name="mlflow-monitor", daemon=True)
                    self._thread.start()
                try:
                    self._q.put_nowait(item)
                    self._pending += 1
                except queue.Full:
                    self._counts["dropped"] += 1
                    log.warning("monitoring writer queue full: dropped %d metrics for %s", len(metrics), target)
        if state is not None:
            state[MONITOR_KEY] = self.counts()

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until the queue is written (or failed); False when `timeout_s` passed first."""
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def _run(self) -> None:
        while True:
            item = self._q.get()
            error = None
            try:
                log_metrics(ensure_monitor_run(item.target), item.metrics, item.step, item.ts_ms)
            except Exception as exc:  # noqa: BLE001 - counted and logged; the agent goes on
                error = f"{type(exc).__name__}: {str(exc)[:300]}"
                log.warning("monitoring write for %s failed: %s", item.target, error)
                with _runs_lock:
                    _runs.pop(item.target, None)  # find the run again next time (deleted by hand?)
            with self._idle:
                self._pending -= 1
                if error is None:
                    self._counts["written"] += 1
                else:
                    self._counts["failed"] += 1
                    self._counts["last_error"] = error
                self._idle.notify_all()


WRITER = MonitorWriter()


def stop_monitoring(state: dict[str, Any] | None, targets: Iterable[MonitorTarget], timeout_s: float = 10.0) -> None:
    """At an agent's shutdown: write what is queued, then end its monitoring runs (FINISHED). Blocking;
    never raises (failures are counted in `state`)."""
    if not WRITER.flush(timeout_s):
        log.warning("monitoring writer: %s still queued at shutdown", WRITER.counts()["queued"])
    if state is not None:
        state[MONITOR_KEY] = WRITER.counts()
    safe(state, "end monitoring runs", set_monitor_status, list(targets), "FINISHED")


def start_monitoring(state: dict[str, Any] | None, targets: Iterable[MonitorTarget]) -> None:
    """At an agent's startup: find or create its monitoring runs and mark them RUNNING. Blocking; never raises."""
    safe(state, "resume monitoring runs", set_monitor_status, list(targets), "RUNNING")


# -- the retrain chain (blocking; the Executor calls these through `safe`) -------------------------
def link_retrain(model: str, version: str, run_id: str | None, plan_id: str, plan: Mapping[str, Any],
                 monitor: MonitorTarget, counts: Mapping[str, int]) -> None:
    """After a retrain: name and describe the training run, tag it with the plan and the drift checks
    that caused it (the monitoring run and its steps), and describe the model version it registered.
    `counts`: n_train, n_holdout, labelled, critical (what the plan trained on). Idempotent."""
    tags = plan_tags(plan_id, plan, ensure_monitor_run(monitor))
    if run_id:
        tag_run(run_id, {**tags, KIND_TAG: "training", NOTE_TAG: retrain_note(
            model, plan_id, plan, counts.get("n_train", 0), counts.get("n_holdout", 0), counts.get("labelled", 0),
            counts.get("critical", 0))}, name=retrain_run_name(model, plan_id))
    describe_version(model, version, version_description(model, version, plan_id, plan),
                     {**tags, **({TRAINING_RUN_TAG: run_id} if run_id else {})})


def record_gate(model: str, version: str, run_id: str | None, plan_id: str, plan: Mapping[str, Any],
                gate: Mapping[str, float], promoted: bool, reason: str, previous: str | None) -> None:
    """After the promotion gate: the verdict and scores in the version's description and tags, and the
    gate scores as metrics of the training run (comparable across retrains in the UI). Idempotent."""
    describe_version(model, version, version_description(model, version, plan_id, plan, gate, promoted, reason,
                                                         previous), {PROMOTED_TAG: str(promoted).lower()})
    if run_id:
        tag_run(run_id, {PROMOTED_TAG: str(promoted).lower(), "scanflow.gate.reason": clip(reason)})
        scores = {f"gate/{k}": float(v) for k, v in gate.items() if finite_number(v) is not None}
        log_metrics(run_id, scores, 0)


def record_swap(model: str, version: str, run_id: str | None, services: Iterable[str]) -> None:
    """After a hot swap: which services now serve the version, on the version and its training run."""
    names = ",".join(services)
    if not names:
        return
    _client().set_model_version_tag(model, version, SWAPPED_TAG, names)
    if run_id:
        tag_run(run_id, {SWAPPED_TAG: names})


def record_rollback(model: str, version: str, reason: str) -> None:
    """After a progressive delivery rolled a challenger back: why, on the version (it never served all
    traffic; the champion alias never moved)."""
    _client().set_model_version_tag(model, version, ROLLED_BACK_TAG, reason[:5000])


def plan_step(plan_id: str) -> int:
    """The Executor's step for a plan's metrics in a monitoring run: the plan id (its inbox event id)."""
    return int(plan_id) if plan_id.isdigit() else 0
