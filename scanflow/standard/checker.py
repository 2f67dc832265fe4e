"""Checker: analyses what the Tracker logged (drift) and what the service does (SLO, availability).

- `check_drift` (called by the Tracker's strategy): reads the records logged since its own watermark
  from MLflow, runs the drift detector of the model version serving now (scanflow.drift.lifecycle:
  fitted from that version's reference data at bootstrap, or right after a promotion, and logged in
  MLflow; the Checker reloads it whenever the champion changes) and emits `drift.checked` (score,
  p-value, drift flag, drift rate, the request ids of the critical points). Idempotent: the watermark moves only with the action's success.
  The Tracker's window (rows per check) is validated against the detector's `min_window` whenever a
  detector is loaded or refitted (`window_check`): below it, the agent's log says so, `/status` (state
  `window_check`) and every `drift.checked` payload carry `window_too_small` with both numbers, and a
  check of fewer rows is skipped (rows accumulate to the next call) instead of refused as bad input.
  For classifiers it also reports a label-free accuracy estimate of the window (scanflow.drift.performance:
  the champion's confidences, calibrated on its reference holdout) and, as feedback labels arrive for
  earlier windows, their measured accuracy beside the estimate.
- sensor `watch`: polls the primary service's gateway (/admin/state, /metrics); emits
  `service.checked` while something is wrong or being repaired (for the Planner's failover
  hysteresis) and `latency.checked` (the SLO percentile latency of the last interval, `breached`
  when it exceeds the SLO) whenever the Planner has something to decide: a breach (scale up), or more
  replicas serving than the service's minimum (scale down, also with no traffic at all), or traffic, or
  a replica grown above its declared CPU. It carries the interval's observations
  (scanflow.agentkit.observe): arrival rate, service time and CPU per request from the gateway's and
  each replica's counters, the replicas' CPU use, limit and throttling (their own cgroups), the cores
  left on their nodes; the Planner's policies read nothing else.
- sensor `check_delivery`: while the gateway has a challenger (a progressive delivery), each model's
  labelled rows and the challenger's answers as `delivery.checked` (scanflow/standard/checker_delivery.py);
  the drift windows leave the challenger's records out.
- `forward`: the workflow's strategies send these events on to the Planner's inbox, through a durable
  outbox delivered by the `deliver` sensor (scanflow/agentkit/outbox.py).
Run: `scanflow agent run scanflow.standard.checker:agent --port 8002 --peer planner=http://127.0.0.1:8003`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any

import httpx

from scanflow.agent import Agent, Context, PermanentError, TemporaryError
from scanflow.agentkit import delivery_outcomes, gateways, observe, outbox
from scanflow.agentkit.env import drift_window, primary_service, quick, service_url
from scanflow.agentkit.latency import Percentile, histogram, percentile_ms
from scanflow.messages import DriftChecked, LatencyChecked, ServiceChecked
from scanflow.policies.types import slo_breached
from scanflow.standard import checker_delivery
from scanflow.tracking import monitoring

log = logging.getLogger(__name__)
MAX_CRITICAL_IDS = 2000
MIN_ROWS = 20  # check_drift's `min_rows` when the strategy's args name none
WATCH_TIMEOUT_S = 8.0
agent = Agent("checker", role="checker", description="drift, SLO and availability analysis",
              settings_keys=("fpr", "epochs", "copy_tolerance"), needs_workflow=True)


@dataclasses.dataclass
class _Loaded:
    """The champion's detector and accuracy estimator this process loaded, each with the version it
    belongs to (kept in ctx.resources: one per running agent)."""

    detector: Any = None
    detector_version: str | None = None
    estimator: Any = None  # scanflow.drift.performance.PerformanceEstimator of `estimator_version`, or None
    estimator_version: str | None = None


def _loaded(ctx: Context) -> _Loaded:
    return ctx.resources.setdefault("loaded", _Loaded())  # type: ignore[no-any-return]


def _current_detector(ctx: Context) -> tuple[Any, str]:
    """The detector of the model version serving now (the `champion` alias), loaded from MLflow, or fitted
    from that version's reference and logged when none exists yet (just after a promotion). Blocking."""
    from scanflow.agentkit.detectors import detector_options, model_name_of
    from scanflow.drift.lifecycle import ensure_detector, load_detector
    from scanflow.tracking.registry import CHAMPION, get_alias_version

    wf, loaded = ctx.workflow, _loaded(ctx)
    model = model_name_of(wf)
    champion = get_alias_version(model, CHAMPION)
    if champion is None:
        raise TemporaryError(f"no champion of {model!r} yet (bootstrap not done)", delay_s=2.0)
    if loaded.detector is None or loaded.detector_version != champion:
        uri = ensure_detector(wf.name, model, champion, detector_options(wf, quick()))
        loaded.detector, loaded.detector_version = load_detector(uri), champion
        for warning in loaded.detector.metadata().get("warnings") or []:  # e.g. a reference of a few rows replayed
            log.warning("drift detector of %s v%s: %s", model, champion, warning)
    return loaded.detector, champion


def _monitor(ctx: Context) -> monitoring.MonitorTarget:
    """The primary service's monitoring run in MLflow, where the checks are logged for the UI."""
    return monitoring.monitor_target(ctx.workflow.name, primary_service(ctx.workflow).name, ctx.settings.home)


@agent.on_startup
def load_detector(ctx: Context) -> None:
    monitoring.start_monitoring(ctx.state, [_monitor(ctx)])
    try:
        detector, version = _current_detector(ctx)
    except TemporaryError as exc:
        ctx.log.warning("%s; will load on first check", exc)
    else:
        _validate_window(ctx, detector, version)


def configured_window(wf: Any, quick_mode: bool) -> tuple[int | None, int]:
    """Pure: (the Tracker's rows per drift check, the `min_rows` its strategies pass to check_drift) as the
    workflow declares them; (None, MIN_ROWS) when no Tracker is declared (check_drift called by hand)."""
    tracker = next((a for a in wf.agents if a.role == "tracker"), None)
    if tracker is None:
        return None, MIN_ROWS
    rows = [int(a.args.get("min_rows", MIN_ROWS)) for s in tracker.strategies for a in s.actions
            if a.actuator == "check_drift"]
    return drift_window(tracker, quick_mode), min(rows, default=MIN_ROWS)


def window_check(window: int | None, min_rows: int, min_window: int | None) -> dict[str, Any]:
    """Pure: the configured window against the detector's `min_window` (derived from its calibration: below
    it the test does not hold its false-positive rate) and the check's own `min_rows`.

    status "ok", or "window_too_small" when the Tracker announces windows shorter than the detector
    accepts: then each check waits until `needed` rows have arrived, so drift is judged less often than
    configured. `message` says so with the numbers."""
    m = int(min_window or 0)
    needed = max(int(min_rows), m)
    out: dict[str, Any] = {"status": "ok", "window": window, "min_rows": int(min_rows), "min_window": m,
                           "needed": needed}
    if window is not None and window < needed:
        out["status"] = "window_too_small"
        why = f"the detector's min_window {m} (its calibration)" if m >= min_rows else f"check_drift's min_rows {min_rows}"
        out["message"] = (f"the Tracker's window of {window} rows is below {why}: each drift check waits until "
                          f"{needed} rows have arrived; raise the Tracker's window to at least {needed}")
    return out


def _validate_window(ctx: Context, detector: Any, version: str) -> dict[str, Any]:
    """The window check of the detector serving now, kept in the agent's state (shown by /status) and
    logged whenever it changes: at startup and when a new champion's detector is loaded or fitted."""
    window, min_rows = configured_window(ctx.workflow, quick())
    check = window_check(window, min_rows, detector.metadata().get("min_window")) | {"detector_version": version}
    if check != ctx.state.get("window_check"):
        if check["status"] != "ok":
            ctx.log.warning("drift detector of version %s: %s", version, check["message"])
        else:
            ctx.log.info("drift detector of version %s: window %s rows, min_window %s: ok", version,
                         check["window"], check["min_window"])
        ctx.state["window_check"] = check
    return check


@agent.on_shutdown
def end_monitoring(ctx: Context) -> None:
    monitoring.stop_monitoring(ctx.state, [_monitor(ctx)])


def _current_estimator(ctx: Context, version: str) -> Any:
    """The champion's accuracy estimator (None for regression models, models without class scores, or when
    it cannot be built: the drift check goes on without it). Fitted once per version. Blocking."""
    from scanflow.agentkit.detectors import model_name_of
    from scanflow.drift.performance import estimator_for_version

    loaded = _loaded(ctx)
    if loaded.estimator_version != version:
        try:
            loaded.estimator = estimator_for_version(model_name_of(ctx.workflow), version)
        except Exception as exc:  # noqa: BLE001 - an estimate is extra information, never a reason to fail a check
            log.warning("no accuracy estimate for version %s: %s", version, exc)
            loaded.estimator = None
        loaded.estimator_version = version
    return loaded.estimator


def _performance(ctx: Context, version: str, x: Any, row_owner: list[str], to_seq: int) -> dict[str, Any] | None:
    """The window's accuracy estimate and the comparisons with feedback that arrived for earlier windows
    (ctx.state["performance_pending"]). Blocking (model, Tracker lookup)."""
    from scanflow.agent import TemporaryError as Temporary
    from scanflow.drift.performance import compare_with_feedback, pending_window
    from scanflow.tracking.feedback_client import lookup_labels

    est = _current_estimator(ctx, version)
    if est is None:
        return None
    try:
        estimate, predicted = est.window(x)
    except ValueError as exc:
        log.warning("accuracy estimate skipped: %s", exc)
        return None
    pending = [w for w in ctx.state.get("performance_pending", []) if w.get("version") == version]
    window = pending_window(to_seq, estimate, row_owner, predicted) | {"version": version}
    pending.append(window)
    compared: list[dict[str, Any]] = []
    if "tracker" in ctx.peers:
        ids = sorted({rid for w in pending for rid in w["predicted"]})
        try:
            labels = lookup_labels(ctx, ids)
        except (PermanentError, Temporary) as exc:  # no feedback now: compare on a later check
            log.info("feedback lookup skipped: %s", exc)
        else:
            compared, pending = compare_with_feedback(pending, labels)
    ctx.state["performance_pending"] = pending
    return {**estimate.to_dict(), "holdout_accuracy": est.calibration.holdout_accuracy, "feedback": compared}


@agent.actuator("check_drift", max_attempts=5, emits=("drift.checked",))
async def check_drift(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Run the detector on the records logged since the last check; emit `drift.checked`."""
    from scanflow.tracking.predictions import prediction_run_id, read_since

    min_rows = args.get("min_rows", MIN_ROWS)
    if isinstance(min_rows, bool) or not isinstance(min_rows, int) or min_rows < 1:
        raise PermanentError(f"check_drift: min_rows must be an integer >= 1, got {min_rows!r}")
    detector, version = await asyncio.to_thread(_current_detector, ctx)
    window_status = _validate_window(ctx, detector, version)
    run_id = await asyncio.to_thread(prediction_run_id, ctx.workflow.name, ctx.workflow.name)
    if run_id is None:
        return {"skipped": "no predictions logged yet"}
    wm = int(ctx.state.get("watermark", 0))
    batch = delivery_outcomes.declared_only(await asyncio.to_thread(read_since, run_id, wm),
                                            {s.name for s in ctx.workflow.services})
    x = batch.inputs()
    # the detector's own minimum (derived from its calibration) wins over the caller's; rows stay unread
    # (the watermark holds), so the next call tests them with the ones that arrive meanwhile
    min_window = int(detector.metadata().get("min_window") or 0)
    if len(x) < min_window:
        ctx.log.warning("drift check skipped: %d new rows, fewer than the detector's min_window %d", len(x), min_window)
        return {"skipped": f"{len(x)} new rows, fewer than the detector's min_window {min_window}",
                "status": "window_too_small", "window": len(x), "min_window": min_window, "watermark": wm,
                "window_check": window_status}
    if len(x) < min_rows:
        return {"skipped": f"only {len(x)} new rows (min_rows {min_rows})", "status": "too_few_rows", "watermark": wm}
    try:
        report = await asyncio.to_thread(detector.predict, x)
    except ValueError as exc:
        raise PermanentError(f"drift check refused the window: {exc}") from None
    row_owner = [r.request_id for r in batch.records for _ in r.inputs]
    critical = sorted({row_owner[i] for i in report.critical_indices})[:MAX_CRITICAL_IDS]
    # label-free accuracy estimate (classifiers) and, for earlier windows now labelled, the measured one
    performance = await asyncio.to_thread(_performance, ctx, version, x, row_owner, batch.watermark)
    payload = DriftChecked(
        drift=bool(report.is_drift), score=float(report.score), p_value=float(report.p_value),
        fpr=float(report.threshold), drift_rate=float(report.drift_rate), n=int(report.n), critical_ids=critical,
        from_seq=wm, to_seq=batch.watermark, run_id=run_id, detector_version=version,
        # inputs off the reference's scale or range: an integration problem to name, apart from drift
        schema_violation=report.schema_violation,
        # which evidence moved (reconstruction errors, input columns, encoder outputs) and the columns most
        evidence_p=report.metadata.get("evidence_p"), shifted_inputs=report.metadata.get("shifted_inputs"),
        # the configured window against this detector's min_window: "window_too_small" when checks wait
        window_check=window_status, performance=performance,
    ).payload()
    await ctx.emit("drift.checked", payload)
    metrics, step = monitoring.drift_metrics(payload)
    monitoring.WRITER.submit(ctx.state, _monitor(ctx), metrics | _performance_metrics(payload["performance"]), step)
    ctx.state["watermark"] = batch.watermark
    ctx.state["last_report"] = {k: v for k, v in payload.items() if k != "critical_ids"}
    return {k: v for k, v in payload.items() if k != "critical_ids"} | {"critical": len(critical)}


def _performance_metrics(perf: dict[str, Any] | None) -> dict[str, float]:
    """Pure: monitoring metrics of a check's `performance` payload: the estimate and, when labels for an
    earlier window arrived, the newest measured accuracy and the estimate's error on it."""
    if not perf:
        return {}
    out = {"performance/estimated_accuracy": float(perf["estimated_accuracy"])}
    if perf.get("feedback"):
        last = perf["feedback"][-1]
        out["performance/measured_accuracy"] = float(last["measured_accuracy"])
        out["performance/estimate_error"] = float(last["error"])
    return out


@agent.actuator("forward")
async def forward(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Queue the event that fired this strategy for `args.agent`'s inbox (the outbox delivers it, so a
    Planner that is down never holds up this agent's inbox loop)."""
    if ctx.event is None:
        raise PermanentError("forward runs from a strategy (it sends the triggering event on)")
    to = str(args.get("agent", "planner"))
    key = await outbox.enqueue(ctx, to, ctx.event.name, ctx.event.payload)
    return {"to": to, "event": ctx.event.name, "queued": key}


@agent.sensor(every=0.5)
async def deliver(ctx: Context) -> None:
    """Post queued events to their peers, on this sensor's own task."""
    await outbox.deliver(ctx)


# -- service watch -------------------------------------------------------------------------------
def slo_latency_ms(override: float | None, declared: float | None) -> float | None:
    """Pure: the latency SLO the watch judges: an operator's override (`set_slo`), else the declared one."""
    return float(override) if override is not None else declared


@agent.actuator("set_slo")
def set_slo(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Override the primary service's latency SLO (ms) the watch judges, or clear it (`latency_ms`
    null). For a machine busier than the declared SLO allows (the demo's S2 on 2 shared cores holds
    2x the p99 it measures at low load); persisted in the agent's state, so a restart keeps it."""
    value = args.get("latency_ms")
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
        raise PermanentError(f"set_slo: latency_ms must be a number > 0 or null, got {value!r}")
    ctx.state["slo_ms"] = None if value is None else float(value)
    svc = primary_service(ctx.workflow)
    declared = svc.slo.latency_ms if svc.slo else None
    return {"service": svc.name, "slo_ms": slo_latency_ms(ctx.state["slo_ms"], declared), "declared_ms": declared}


@agent.sensor(every=1.0, emits=("service.checked", "latency.checked"))
async def watch(ctx: Context) -> list[tuple[str, dict[str, Any]]]:
    svc = primary_service(ctx.workflow)
    url = service_url(svc)
    events: list[tuple[str, dict[str, Any]]] = []
    replica_texts: dict[str, str] = {}
    try:
        # the gateway answers its admin reads behind the requests it is serving, so under overload (the
        # very thing to see) they are slow: a short timeout would leave the Planner blind exactly then
        async with httpx.AsyncClient(timeout=WATCH_TIMEOUT_S) as http:
            # SCANFLOW_GATEWAY_DISCOVERY=dns: every gateway behind the endpoint, summed (scanflow.agentkit.gateways)
            state, metrics, members, complete = await gateways.scrape(http, url, ctx.settings.gateway_discovery)
            urls = [str(r["url"]) for r in state.get("replicas") or [] if r.get("url")]
            replica_texts = await scrape_replicas(http, urls)
    except (httpx.HTTPError, ValueError) as exc:
        state, metrics, members, complete = {"error": f"{type(exc).__name__}"}, "", [], False
    scraped_at = time.time()
    if not state.get("error"):  # a progressive delivery's challenger, for the delivery check
        ctx.state["challenger"] = state.get("challenger")
    replicas = state.get("replicas") or []
    backup = state.get("backup") or {}
    payload = ServiceChecked(
        service=svc.name, primary_healthy=any(r.get("healthy") for r in replicas),
        backup_healthy=bool(backup.get("healthy", svc.backup is not None)),
        routed_to=state.get("routed_to"), route=state.get("route"),
        healthy_replicas=sum(bool(r.get("healthy")) for r in replicas), replicas=len(replicas),
        in_flight=sum(int(r.get("outstanding", 0)) for r in replicas),
    ).payload()
    if not ctx.state.get("seen_healthy"):  # the Executor is still deploying: nothing to judge yet
        ctx.state["seen_healthy"] = payload["primary_healthy"]
        return []
    # only what the Planner needs: trouble, and the healthy checks while a failover is in force
    abnormal = not payload["primary_healthy"] or payload["route"] not in (None, "auto")
    if abnormal or ctx.state.get("last_abnormal"):
        events.append(("service.checked", payload))
    ctx.state["last_abnormal"] = abnormal
    slo_ms = slo_latency_ms(ctx.state.get("slo_ms"), svc.slo.latency_ms if svc.slo else None)
    if slo_ms is not None and svc.slo and not state.get("error") and metrics:
        hist = histogram(metrics, "scanflow_gateway_request_latency_seconds")
        prev = {float(k): v for k, v in ctx.state.get("latency_hist", {}).items()}
        ctx.state["latency_hist"] = {str(k): v for k, v in hist.items()}
        judged = gateways.continues(ctx.state.get("gateway_members"), members, complete)
        ctx.state["gateway_members"] = [list(m) for m in members]
        if not judged:
            # other gateway processes than last time, or not all of them answered: the sums jumped, so this
            # interval is not reported at all (a latency.checked without figures reads as idle to the
            # Planner); this read is the base of the next interval
            ctx.state["observe"] = {}
            _observe(ctx, metrics, replica_texts, scraped_at)
            return events
        p = percentile_ms(prev, hist, svc.slo.percentile / 100.0)
        obs = _observe(ctx, metrics, replica_texts, scraped_at)
        latency = latency_event(payload, p, slo_ms, svc.min_replicas, obs=obs, declared_cpu=svc.resources.cpu)
        if latency is not None:
            events.append(("latency.checked", latency))
            monitoring.WRITER.submit(ctx.state, _monitor(ctx), monitoring.latency_metrics(
                latency, svc.slo.percentile) | monitoring.resource_metrics(latency),
                monitoring.next_step(ctx.state, "latency"))
    return events


@agent.sensor(every=checker_delivery.CHECK_EVERY_S, emits=("delivery.checked",))
async def check_delivery(ctx: Context) -> list[tuple[str, dict[str, Any]]]:
    """While the primary service's gateway has a challenger: each model's labelled rows and the
    challenger's answers, as `delivery.checked` (scanflow/standard/checker_delivery.py)."""
    svc = primary_service(ctx.workflow)
    return await checker_delivery.check(ctx, slo_latency_ms(ctx.state.get("slo_ms"), svc.slo.latency_ms if svc.slo else None))


async def scrape_replicas(http: httpx.AsyncClient, urls: list[str]) -> dict[str, str]:
    """Each replica's /metrics text, concurrently; a replica that does not answer is left out (its
    figures are then unknown this tick, never zero)."""
    async def one(u: str) -> tuple[str, str | None]:
        try:
            r = await http.get(f"{u}/metrics")
            return u, r.text if r.status_code == 200 else None
        except httpx.HTTPError:
            return u, None

    got = await asyncio.gather(*(one(u) for u in urls))
    return {u: t for u, t in got if t is not None}


def _observe(ctx: Context, gateway_text: str, replica_texts: dict[str, str], now: float) -> dict[str, Any]:
    """This interval's observations (scanflow.agentkit.observe) from this scrape and the last one, kept
    in the agent's state (so a restarted Checker resumes with rates, not a blind tick)."""
    cur_gw = observe.parse_gateway(gateway_text)
    cur_reps = {u: observe.parse_replica(t) for u, t in replica_texts.items()}
    last = ctx.state.get("observe") or {}
    prev_gw = observe.GatewaySample(**last["gateway"]) if last.get("gateway") else None
    prev_reps = {u: observe.ReplicaSample(**v) for u, v in (last.get("replicas") or {}).items()}
    dt = now - float(last.get("at", now))
    out = observe.window(prev_gw, cur_gw, prev_reps, cur_reps, dt)
    ctx.state["observe"] = {"at": now, "gateway": None if cur_gw is None else dataclasses.asdict(cur_gw),
                            "replicas": {u: dataclasses.asdict(v) for u, v in cur_reps.items()}}
    return out


def latency_event(observed: dict[str, Any], p: Percentile | None, slo_ms: float, min_replicas: int, *,
                  obs: dict[str, Any] | None = None, declared_cpu: float | None = None) -> dict[str, Any] | None:
    """Pure: this tick's `latency.checked` payload for the Planner's scaling policy, or None when it has
    nothing to decide: latency within the SLO (or no request completed), no replica above the service's
    minimum to remove, no request arrived (`obs`), and no replica grown above its declared `declared_cpu`
    (to shrink). `observed` is the gateway's view (replicas serving, healthy, in flight); `obs` the
    interval's observations (scanflow.agentkit.observe.window), merged into the payload.

    A percentile past the histogram's top bucket is only a lower bound (`latency_lower_bound`): a breach
    when the SLO is at or under it. With no request completed `latency_ms` is None (the policy reads
    that as idle), so a service whose traffic stopped still scales down.
    """
    breached = p is not None and slo_breached(p.ms, slo_ms, p.above)
    o = obs or {}
    traffic = bool(o.get("arrival_rate"))
    grown = declared_cpu is not None and o.get("cpu_limit_cores") is not None \
        and float(o["cpu_limit_cores"]) > declared_cpu + 1e-6
    if not (breached or traffic or grown) and int(observed.get("replicas", 0)) <= min_replicas:
        return None
    return LatencyChecked.model_validate({
        **o, **observed, "latency_ms": None if p is None else p.ms, "latency_lower_bound": bool(p and p.above),
        "slo_ms": slo_ms, "breached": breached, "min_replicas": min_replicas}).payload()
