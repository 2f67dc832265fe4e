"""Planner: decides what to change, with the pure policies of scanflow.policies; every decision says why.

- `plan_retrain` (on each `drift.checked` the Checker forwards): retrain policy (a CUSUM of the drift
  verdicts whose alarm threshold holds false retrains to `retrain.false_alarms_per_day` of stable traffic
  at the window rate this agent observes, or `rule: k_of_m`; no retrain running; cooldown). When it says
  retrain, it emits `drift.detected`
  carrying the critical points of the drifted windows; the workflow's `retrain-on-drift` strategy
  (its own cooldown) then runs `submit_plan`, which hands the plan to the Executor's inbox. A retrain
  waits until the drifted windows gave `min_points` critical points (400 quick): fewer cannot train a
  challenger that beats the champion.
- `plan_failover` (on `service.checked`): failover policy with hysteresis (fail over after N failed
  checks, return after M healthy ones) -> a `route` plan for the Executor.
- `plan_delivery` (on `delivery.checked`): a progressive delivery's stage judged live (scanflow.policies.delivery:
  non-inferiority on labelled rows, errors, p99) -> a `delivery` plan (advance, promote, rollback).
- `plan_scale` (on `latency.checked`): the scaling policy (scanflow.policies.elastic; vertical-first
  when `autoscale.mode` says so: grow a throttled replica in place, add replicas past the per-replica
  ceiling) on the Checker's observations only -> `resources` (cores, threads; with `autoscale.pin`
  on, pinning too: scanflow.policies.pinning) and/or `scale`. It
  decides from the replica count the Checker observed at the gateway (the platform may have restored
  or lost replicas), not from its own earlier plans; only a scale it asked for that has not shown yet
  (within `pending_s`) counts, as replicas still starting (`scale_view`).
Policy states live in the agent's persisted state, so a restarted Planner keeps its hysteresis.
`GET /plans?limit=N&policy=P` lists the policy decisions (reason, inputs) newest last (the last 200 kept).
Plans for the Executor go through a durable outbox (scanflow/agentkit/outbox.py): the actuator
queues them and returns, the `deliver` sensor posts them, so a restarting Executor never holds up
this agent's inbox (failover decisions keep coming while a retrain plan waits).
Run: `scanflow agent run scanflow.standard.planner:agent --port 8003 --peer executor=http://127.0.0.1:8004`.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

from fastapi import Depends, Query

from scanflow import messages
from scanflow.agent import Agent, Context, PermanentError, get_context
from scanflow.agentkit import outbox
from scanflow.agentkit.env import primary_service, quick
from scanflow.policies import autoscale, elastic, failover, pinning, retrain
from scanflow.policies.guardrails import Guardrails
from scanflow.policies.types import state_from_json, state_to_json
from scanflow.spec import Affinity, Resources, Service
from scanflow.standard import planner_delivery
from scanflow.tracking import monitoring

MAX_DECISIONS = 200
MAX_CRITICAL = 4000
MAX_STEPS = 50  # drifted checks a plan names (its seq range covers them all anyway)
agent = Agent("planner", role="planner", description="retrain, failover and scaling decisions",
              settings_keys=("retrain", "promotion", "autoscale", "failover"),
              messages=messages.receiving("drift.checked", "service.checked", "latency.checked", "delivery.checked"),
              needs_workflow=True)


def _setting(ctx: Context, key: str) -> dict[str, Any]:
    """One section of this Planner's settings in its workflow (`retrain`, `autoscale`, `failover`)."""
    return dict(ctx.spec.settings.get(key) or {})


def _monitor(ctx: Context) -> monitoring.MonitorTarget:
    """The primary service's monitoring run in MLflow, where the decisions are logged for the UI."""
    return monitoring.monitor_target(ctx.workflow.name, primary_service(ctx.workflow).name, ctx.settings.home)


@agent.on_startup
def start_monitoring(ctx: Context) -> None:
    monitoring.start_monitoring(ctx.state, [_monitor(ctx)])


@agent.on_shutdown
def end_monitoring(ctx: Context) -> None:
    monitoring.stop_monitoring(ctx.state, [_monitor(ctx)])


def _record(ctx: Context, policy: str, decision: Any, **extra: Any) -> dict[str, Any]:
    rec = {"policy": policy, "at": ctx.now(), "key": ctx.key, **decision.to_dict(), **extra}
    ctx.state["decisions"] = [*ctx.state.get("decisions", []), rec][-MAX_DECISIONS:]
    return rec


def _message(ctx: Context, args: dict[str, Any], event: str) -> Any:
    """The triggering event's payload as its typed message (scanflow.messages). Called directly (POST
    /actuators, no event), the actuator takes the payload in its args; a strategy's own args ride along
    and are ignored by the model."""
    try:
        return messages.parse(event, {**(ctx.event.payload if ctx.event else {}), **args})
    except messages.MessageError as exc:
        raise PermanentError(str(exc)) from None


def min_points(retrain_settings: dict[str, Any], quick_mode: bool) -> int:
    """Pure: critical points to gather before a retrain (`retrain.min_points`, `quick_min_points`; 1000,
    quick 400): with fewer, the challenger trains on too few distinct rows to beat the champion on the
    held-out ones (docs/benchmarks/s1-retrain.md says how the defaults were chosen)."""
    c = retrain_settings
    return int(c.get("quick_min_points" if quick_mode else "min_points", 400 if quick_mode else 1000))


def min_labelled(retrain_settings: dict[str, Any], quick_mode: bool) -> int:
    """Pure: critical points with feedback labels needed before a retrain (`retrain.min_labelled`,
    `quick_min_labelled`; 300, quick 150): the Executor trains on 70 % of them and holds 30 % out for
    the promotion gate, and labels arrive late and for some requests only."""
    c = retrain_settings
    return int(c.get("quick_min_labelled" if quick_mode else "min_labelled", 150 if quick_mode else 300))


def gate_on_points(decision: retrain.RetrainDecision, new: retrain.RetrainState, waiting: retrain.RetrainState,
                   n_points: int, needed: int, n_labelled: int | None = None,
                   needed_labelled: int = 0) -> tuple[retrain.RetrainDecision, retrain.RetrainState]:
    """Pure: a 'retrain' with fewer than `needed` critical points, or fewer than `needed_labelled` of them
    with true labels from feedback (`n_labelled`, None: not counted), waits. It keeps `waiting` (the window
    history with this window added, cooldown not started), so the next drifted window asks again.
    Without labels there is nothing true to train on: the reason says so instead of retraining blind."""
    if not decision.retrain:
        return decision, new
    inputs = {**decision.inputs, "points": n_points, "min_points": needed}
    if n_points < needed:
        reason = f"wait: {n_points} critical points < {needed} needed ({decision.reason})"
        return retrain.RetrainDecision(reason, inputs), waiting
    if n_labelled is None or n_labelled >= needed_labelled:
        return decision, new
    inputs |= {"labelled": n_labelled, "min_labelled": needed_labelled}
    if n_labelled == 0:
        reason = (f"wait: no feedback labels for any of the {n_points} critical points; not retraining blind "
                  f"(clients send true labels to the Tracker's POST /feedback) ({decision.reason})")
    else:
        reason = (f"wait: {n_labelled} of {n_points} critical points have feedback labels < {needed_labelled} "
                  f"needed ({decision.reason})")
    return retrain.RetrainDecision(reason, inputs), waiting


def count_labelled(ctx: Context, ids: list[str]) -> int:
    """How many of `ids` have true labels at the Tracker (its feedback log). Blocking (HTTP)."""
    from scanflow.tracking.feedback_client import lookup_labels

    return len(lookup_labels(ctx, ids))


RETRAIN_KEYS = {f.name for f in dataclasses.fields(retrain.RetrainConfig)}


def retrain_config(settings: dict[str, Any]) -> retrain.RetrainConfig:
    """The retrain policy's config from the planner's `retrain` settings (RetrainConfig's fields; `time_scale`
    divides the cooldown and the assumed window interval). A bad value is a clear error, not a crash."""
    unknown = sorted(set(settings) - RETRAIN_KEYS - {"min_points", "quick_min_points", "min_labelled",
                                                      "quick_min_labelled"})
    if unknown:
        raise PermanentError(f"planner setting retrain: unknown keys {unknown} (known: {sorted(RETRAIN_KEYS)})")
    try:
        return retrain.RetrainConfig(**{k: v for k, v in settings.items() if k in RETRAIN_KEYS})
    except (TypeError, ValueError) as exc:
        raise PermanentError(f"planner setting retrain: {exc}") from None


@agent.actuator("plan_retrain", max_attempts=5, emits=("drift.detected",))
def plan_retrain(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    p: messages.DriftChecked = _message(ctx, args, "drift.checked")
    config = retrain_config(_setting(ctx, "retrain"))
    state = state_from_json(retrain.RetrainState, ctx.state.get("retrain", {}))
    rctx = retrain.RetrainContext(now=ctx.now(), drift=p.drift, drift_score=p.score, window_fpr=p.fpr,
                                  version=p.detector_version, config=config, state=state)
    decision, new = retrain.decide(rctx)
    # critical points of the windows that count: drifted windows only (not those a retrain in flight
    # answers), cleared after a retrain
    counts = p.drift and not retrain.answered(rctx)
    pool = list(ctx.state.get("critical_ids", [])) + (list(p.critical_ids) if counts else [])
    pool = list(dict.fromkeys(pool))[-MAX_CRITICAL:]
    waiting = retrain.observe(rctx)
    # labels are counted only when everything else says retrain (one Tracker call, before any state moves)
    needed = min_points(_setting(ctx, "retrain"), quick())
    labelled = count_labelled(ctx, pool) if decision.retrain and len(pool) >= needed else None
    decision, new = gate_on_points(decision, new, waiting, len(pool), needed, labelled,
                                   min_labelled(_setting(ctx, "retrain"), quick()))
    # the earliest and latest records of those windows: the Executor reads the prediction log between them
    from_seq, to_seq = ctx.state.get("critical_from_seq"), ctx.state.get("critical_to_seq")
    if counts and p.from_seq is not None:
        from_seq = p.from_seq if from_seq is None else min(int(from_seq), p.from_seq)
    if counts and p.to_seq is not None:
        to_seq = p.to_seq if to_seq is None else max(int(to_seq), p.to_seq)
    # the drifted checks themselves: their steps in the Checker's monitoring run (to_seq), for the UI's links
    steps = list(ctx.state.get("critical_steps", []))
    if counts and p.to_seq is not None:
        steps.append(p.to_seq)
    ctx.state["critical_ids"] = pool
    ctx.state["critical_from_seq"] = from_seq
    ctx.state["critical_to_seq"] = to_seq
    ctx.state["critical_steps"] = steps[-MAX_STEPS:]
    ctx.state["retrain"] = state_to_json(new)
    rec = _record(ctx, "retrain", decision)
    monitoring.WRITER.submit(ctx.state, _monitor(ctx), monitoring.retrain_decision_metrics(
        decision.retrain, waiting.windows, len(pool), labelled, waiting.cusum, decision.inputs.get("threshold")),
        p.to_seq or 0)  # the step of the drift check this answers
    if decision.retrain:
        ctx.state["critical_ids"] = []
        ctx.state["critical_from_seq"] = None
        ctx.state["critical_to_seq"] = None
        ctx.state["critical_steps"] = []
        ctx.emit_sync("drift.detected", messages.DriftDetected(
            reason=decision.reason, critical_ids=pool, from_seq=from_seq, to_seq=to_seq, labelled=labelled,
            drift_rate=p.drift_rate, score=p.score, drift_steps=steps[-MAX_STEPS:], decision_key=ctx.key).payload())
    return {"retrain": decision.retrain, "reason": decision.reason, "decision_at": rec["at"],
            "critical_points": len(pool), "labelled": labelled}


@agent.actuator("submit_plan", emits=("plan.approved",))
async def submit_plan(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Queue a plan for the Executor's durable inbox as `plan.approved` (the outbox delivers it)."""
    plan = _message(ctx, args, "plan.approved")
    key = await outbox.enqueue(ctx, "executor", "plan.approved", plan.payload())
    return {"plan": plan.plan, "queued": key}


@agent.sensor(every=0.5)
async def deliver(ctx: Context) -> None:
    """Post the queued plans to the Executor (on this sensor's own task, never the inbox loop)."""
    await outbox.deliver(ctx)


@agent.actuator("plan_failover", emits=("plan.approved",))
async def plan_failover(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    p: messages.ServiceChecked = _message(ctx, args, "service.checked")
    c = _setting(ctx, "failover")
    config = failover.FailoverConfig(int(c.get("fail_checks", 3)), int(c.get("recover_checks", 5)))
    st = dict(ctx.state.get("failover", {}))
    if "streak" in st:  # written before the state was kept by its own fields (`primary` was `streak`)
        st["primary"] = st.pop("streak")
    state = state_from_json(failover.FailoverState, st)
    decision, new = failover.decide(failover.FailoverContext(
        now=ctx.now(), primary_healthy=p.primary_healthy, backup_healthy=p.backup_healthy, config=config,
        state=state))
    ctx.state["failover"] = state_to_json(new)
    if decision.changed:
        svc = primary_service(ctx.workflow)
        to = svc.backup if decision.route_to == "backup" else None
        await outbox.enqueue(ctx, "executor", "plan.approved",
                             messages.RoutePlan(service=svc.name, to=to, reason=decision.reason).payload())
    _record(ctx, "failover", decision)
    monitoring.WRITER.submit(ctx.state, _monitor(ctx), {"plan/route_backup": float(decision.route_to == "backup"),
                                                        "plan/route_changed": float(decision.changed)},
                             monitoring.next_step(ctx.state, "failover"))
    return {"route_to": decision.route_to, "changed": decision.changed, "reason": decision.reason}


@agent.actuator("plan_delivery", emits=("plan.approved",))
async def plan_delivery(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """A progressive delivery's stage judged on what the Checker measured (scanflow/standard/planner_delivery.py);
    a `delivery` plan for the Executor when the stage advances, promotes or rolls back. Holds are kept in
    the state (`delivery.last`), not in the decision list, which they would flood."""
    p: messages.DeliveryChecked = _message(ctx, args, "delivery.checked")
    decision, plan = planner_delivery.decide(ctx, p)
    if plan is not None:
        await outbox.enqueue(ctx, "executor", "plan.approved", plan.payload())
        _record(ctx, "delivery", decision, delivery=p.delivery)
    monitoring.WRITER.submit(ctx.state, _monitor(ctx), planner_delivery.monitoring_metrics(decision),
                             monitoring.next_step(ctx.state, "delivery"))
    return {"action": decision.action, "stage": decision.stage, "share": decision.share, "reason": decision.reason}


def autoscale_config(settings: dict[str, Any], svc: Service) -> tuple[autoscale.AutoscaleConfig, float]:
    """(policy config, pending_s) from the planner's `autoscale` settings, bounded by the service's min/max
    replicas. Settings: AutoscaleConfig fields, `time_scale` (divides every duration: demos, tests),
    `guardrails` (Guardrails fields but the bounds), `pending_s` (how long a scale asked for may take to
    show at the gateway, 60 s)."""
    known = {f.name for f in dataclasses.fields(autoscale.AutoscaleConfig)} - {"guardrails"}
    time_scale = float(settings.get("time_scale", 1.0))
    cfg = autoscale.config_for(svc, time_scale=time_scale,
                               **{k: float(v) for k, v in settings.items() if k in known})
    fixed = {"min_replicas", "max_replicas", "time_scale"}
    gfields = {f.name for f in dataclasses.fields(Guardrails)} - fixed
    g = {k: v for k, v in dict(settings.get("guardrails") or {}).items() if k in gfields}
    if g:
        cfg = dataclasses.replace(cfg, guardrails=dataclasses.replace(cfg.guardrails, **g))
    return cfg, float(settings.get("pending_s", 60.0)) / time_scale


def scale_view(observed: int | None, healthy: int | None, asked: int | None, asked_at: float | None,
               now: float, pending_s: float, declared: int) -> tuple[int, int | None]:
    """Pure: (current, ready) replicas for the autoscale policy.

    The observed count (replicas serving at the gateway, as the Checker saw it) wins: the platform
    may have restored or lost replicas since the Planner last asked. One exception: a scale the Planner
    asked for less than `pending_s` ago that has not shown yet is in progress (the gateway lists a
    replica only once it is ready), so the asked count is current and the observed ones are ready,
    and the policy neither asks again nor undoes it. With nothing observed: the last ask, else the
    declared count.
    """
    if observed is None:
        return (asked if asked is not None else declared), healthy
    ready = observed if healthy is None else min(observed, healthy)
    if asked is not None and asked_at is not None and asked != observed and now - asked_at < pending_s:
        return asked, min(ready, asked)
    return observed, ready


SCALE_OVERRIDES = frozenset({"mode", "min_cpu", "max_cpu", "cpu_step"})


def elastic_config(settings: dict[str, Any], svc: Service) -> tuple[elastic.ElasticConfig, float]:
    """(policy config, pending_s): `autoscale_config` plus the vertical settings: `mode`
    ("vertical-first" or "horizontal", the default), `min_cpu`, `max_cpu` (None: the node's CPU count
    as the replicas report it), `cpu_step`, `throttled_high`, `saturated_utilization`, `shrink_headroom`,
    `cpu_down_ticks`, `cpu_cooldown_down_s`, `flap_window_s`."""
    scale, pending_s = autoscale_config(settings, svc)
    kw: dict[str, Any] = {"vertical": str(settings.get("mode", "horizontal")) == "vertical-first"}
    for key in ("min_cpu", "cpu_step", "throttled_high", "saturated_utilization", "shrink_headroom"):
        if settings.get(key) is not None:
            kw[key] = float(settings[key])
    if settings.get("max_cpu") is not None:
        kw["max_cpu"] = float(settings["max_cpu"])
    if settings.get("cpu_down_ticks") is not None:
        kw["cpu_down_ticks"] = int(settings["cpu_down_ticks"])
    if settings.get("flap_window_s") is not None:
        kw["flap_window_s"] = float(settings["flap_window_s"])
    if settings.get("cpu_cooldown_down_s") is not None:
        kw["cooldown_down_s"] = float(settings["cpu_cooldown_down_s"])
    return elastic.ElasticConfig(scale=scale, **kw), pending_s


def pin_config(settings: dict[str, Any]) -> pinning.PinConfig:
    """The pinning policy's config from the planner's `autoscale` settings: `pin` ("none", the default:
    plans never touch affinity; "pinned"; "numa": CPUMEM) and `pin_reserved_cores` (1). ValueError on
    a bad value (the caller turns it into a clear error)."""
    return pinning.PinConfig(mode=str(settings.get("pin", "none")),  # type: ignore[arg-type]
                             reserved_cores=float(settings.get("pin_reserved_cores", 1.0)))


def resources_plan(svc: Service, cpu: float, threads: int, pin: pinning.PinDecision, reason: str,
                   key: str | None) -> dict[str, Any]:
    """Pure: the `resources` plan for the Executor's `set_resources`. With a pinning decision (pinning
    on), the plan carries the service's declared affinity (its node selector and spread kept) with the
    decided policy, and says why it pinned or not; pinning off, no affinity (the platform keeps its own)."""
    resources = Resources(cpu=cpu, memory=svc.resources.memory)
    if pin.affinity is None:
        plan = messages.ResourcesPlan(service=svc.name, resources=resources, threads=threads, reason=reason,
                                      decision_key=key)
    else:
        plan = messages.ResourcesPlan(
            service=svc.name, resources=resources, threads=threads, reason=f"{reason}; {pin.reason}",
            decision_key=key, affinity=Affinity.model_validate({**svc.affinity.model_dump(), "policy": pin.affinity}),
            pinning=pin.reason)
    return plan.payload()


def plan_resources(svc: Service, decision: elastic.ElasticDecision, cpu_now: float, replicas: int,
                   node_cpus: float | None, pin_cfg: pinning.PinConfig, pinned_now: str,
                   key: str | None) -> tuple[dict[str, Any] | None, pinning.PinDecision]:
    """Pure: (the `resources` plan this tick asks for, or None; the pinning decision). A plan goes out when
    the cores per replica change, or (pinning on) when the pinning for the size and replica count after
    this tick differs from the one asked last (`pinned_now`): e.g. replicas added that no longer fit the
    exclusive cores are unpinned by a plan queued before the `scale` one."""
    pin = pinning.decide(pinning.PinContext(cpu=decision.cpu, replicas=replicas, node_cpus=node_cpus, config=pin_cfg))
    repin = pin.affinity is not None and pin.affinity != pinned_now
    if decision.cpu == cpu_now and not repin:
        return None, pin
    return resources_plan(svc, decision.cpu, decision.threads, pin, decision.reason, key), pin


def cpu_view(observed: float | None, asked: float | None, asked_at: float | None, now: float, pending_s: float,
             declared: float, asked_from: float | None = None) -> float:
    """Pure: the cores per replica the policy starts from. What the replicas report as their limit wins
    (read back from their own cgroups), except a resize asked for less than `pending_s` ago that has
    not shown yet: it is in flight, and asking again would only queue duplicates. Not shown yet means
    the replicas still report the size they had when it was asked (`asked_from`): a size that is
    neither that nor the one asked was set by someone else (an operator's resize) and wins at once."""
    moved_elsewhere = observed is not None and asked_from is not None and abs(observed - asked_from) > 1e-3
    if asked is not None and asked_at is not None and now - asked_at < pending_s \
            and (observed is None or abs(observed - asked) > 1e-3) and not moved_elsewhere:
        return asked
    return observed if observed is not None and observed > 0 else declared


def scale_state(autoscale_json: dict[str, Any], elastic_json: dict[str, Any]) -> elastic.ElasticState:
    """The scaling policy's state as `plan_scale` stored it: its horizontal part under `autoscale`, the
    rest under `elastic`. A first tick counts as long after any resize (nothing to let settle)."""
    return state_from_json(elastic.ElasticState, {"ticks_since_cpu_change": FIRST_TICKS_SINCE_RESIZE,
                                                  **elastic_json, "scale": autoscale_json})


FIRST_TICKS_SINCE_RESIZE = 1000


@agent.actuator("plan_scale", emits=("plan.approved",))
async def plan_scale(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Scaling policy on a latency event (scanflow.policies.elastic: vertical-first when the settings say
    so, else horizontal only), from the Checker's observations only. A `resources` plan (cores and
    threads per replica) is queued before a `scale` plan, so replicas that stay grow before others go.
    Its state (hysteresis, cooldowns, down windows) is kept in ctx.state between ticks and restarts."""
    p: messages.LatencyChecked = _message(ctx, args, "latency.checked")
    svc = primary_service(ctx.workflow)
    # the strategy's own args may override the vertical knobs (e.g. a scenario about horizontal scaling
    # at a fixed replica size posts the strategy with {"mode": "horizontal"})
    overrides = {k: v for k, v in args.items() if k in SCALE_OVERRIDES}
    settings = {**_setting(ctx, "autoscale"), **overrides}
    config, pending_s = elastic_config(settings, svc)
    try:
        pin_cfg = pin_config(settings)
    except ValueError as exc:
        raise PermanentError(f"planner setting autoscale.pin / pin_reserved_cores: {exc}") from None
    now = ctx.now()
    asked = ctx.state.get("autoscale_asked") or {}
    observed = p.replicas
    current, ready = scale_view(observed, p.healthy_replicas, asked.get("replicas"), asked.get("at"), now,
                                pending_s, svc.replicas)
    asked_cpu = ctx.state.get("resources_asked") or {}
    cpu = cpu_view(elastic.effective_cpu(p.cpu_limit_cores, p.threads),
                   asked_cpu.get("cpu"), asked_cpu.get("at"), now, pending_s, svc.resources.cpu, asked_cpu.get("from"))
    state = scale_state(ctx.state.get("autoscale", {}), ctx.state.get("elastic", {}))
    decision, new = elastic.decide(elastic.ElasticContext(
        now=now, current_replicas=current, cpu=cpu, slo_latency_ms=p.slo_ms, latency_ms=p.latency_ms,
        latency_lower_bound=p.latency_lower_bound, in_flight=p.in_flight, arrival_rate=p.arrival_rate,
        cpu_per_request_ms=p.cpu_per_request_ms, service_time_ms=p.service_time_ms,
        cpu_utilization=p.cpu_utilization, throttled_ratio=p.throttled_ratio,
        node_cpus=None if p.node_cpus is None else float(p.node_cpus), node_idle_cores=p.node_idle_cores,
        headroom_cores_per_replica=p.headroom_cores_per_replica, ready_replicas=ready, config=config, state=state))
    ctx.state["autoscale"] = state_to_json(new.scale)
    ctx.state["elastic"] = state_to_json(new, exclude={"scale"})
    want = max(svc.min_replicas, min(svc.max_replicas, int(decision.replicas or current)))
    # pinning (opt-in) for the size and count after this tick: its own change is a resources plan too
    res_plan, pin = plan_resources(svc, decision, cpu, want, None if p.node_cpus is None else float(p.node_cpus),
                                   pin_cfg,
                                   str(ctx.state.get("affinity_asked", svc.affinity.policy)), ctx.key)
    if res_plan is not None:
        ctx.state["resources_asked"] = {"cpu": decision.cpu, "at": now, "from": cpu}
        if pin.affinity is not None:
            ctx.state["affinity_asked"] = pin.affinity
        await outbox.enqueue(ctx, "executor", "plan.approved", res_plan)
    if want != current:
        ctx.state["autoscale_asked"] = {"replicas": want, "at": now}
        await outbox.enqueue(ctx, "executor", "plan.approved",
                             messages.ScalePlan(service=svc.name, replicas=want, reason=decision.reason).payload())
    _record(ctx, "autoscale", decision, quick=quick(), observed_replicas=observed, pinning=pin.reason,
            affinity=pin.affinity)
    monitoring.WRITER.submit(ctx.state, _monitor(ctx), {"plan/replicas": float(want), "plan/replicas_current":
                                                        float(current), "plan/cpu": float(decision.cpu),
                                                        "plan/flaps": float(new.flaps)},
                             monitoring.next_step(ctx.state, "autoscale"))
    return {"replicas": want, "current": current, "observed": observed, "cpu": decision.cpu, "current_cpu": cpu,
            "threads": decision.threads, "action": decision.action, "reason": decision.reason, "flaps": new.flaps,
            "affinity": pin.affinity, "pinning": pin.reason}


@agent.router.get("/plans")
async def plans(ctx: Annotated[Context, Depends(get_context)],
                limit: Annotated[int, Query(ge=1, le=MAX_DECISIONS)] = MAX_DECISIONS,
                policy: Annotated[str | None, Query(max_length=100)] = None) -> list[dict[str, Any]]:
    """The newest `limit` policy decisions (of the last MAX_DECISIONS kept), of one `policy` if given,
    oldest first (the strategies' decisions are at GET /decisions)."""
    kept = [p for p in ctx.state.get("decisions", []) if policy is None or p.get("policy") == policy]
    return kept[-limit:]
