"""Executor: acts on the platform. Owns the platform (SCANFLOW_PLATFORM: local processes by default, or
kubernetes in SCANFLOW_NAMESPACE) and deploys the workflow's services at startup.

Plans arrive in its inbox as `plan.approved` (from the Planner); the workflow's strategies run:
- plan 'retrain' -> `retrain`, `evaluate_and_promote`, `swap_model`, in order:
  retrain: the training job on its clean data plus the plan's critical points that feedback labelled
    (true labels clients sent to the Tracker's POST /feedback, joined by request id; never the model's
    own outputs); a share of them (`holdout_fraction`) is held out for the gate. The job also gets the
    recent unlabelled inputs since the drift. The new model becomes `challenger`. Once per plan: the
    job's MLflow run is tagged with the plan (`scanflow.plan`); a retry after a crash reuses a finished
    run of the plan and its registered version instead of training again.
  evaluate_and_promote: challenger vs champion on the champion's clean reference holdout (logged by
    its training job, scanflow.tracking.reference) AND the plan's labelled drifted holdout; accuracy
    for classifiers, R^2 for regression; promoted to `champion` only if the promotion policy says it
    is better (the reason is recorded in the alias history in MLflow). Before the alias moves, the
    new champion's serving reference (the recent drifted inputs) is logged, so the Checker fits its
    detector on what the new model serves and the loop converges.
  swap_model: every service serving this model hot-swaps to the new champion (no failed request).
  With `delivery: progressive` on the service, a challenger that passed the gate gets its own replicas
  and goes through the declared shadow and canary stages first (scanflow/standard/executor_delivery.py);
  plan 'delivery' -> `deliver`: the next stage, or the promotion (alias and swap), or the rollback.
- plan 'route' -> `route`, 'scale' -> `scale`, 'resources' -> `set_resources`.
Every actuator is idempotent under its key (the runtime never re-runs a finished one; a step cut by a
crash re-runs and finds its own earlier effects). At startup (local platform) it adopts the services a
previous, SIGKILLed incarnation left running (they never stop serving), kills the rest of what it left
(a cut training job re-runs), and deploys only what is missing.
`GET /services` shows what the platform runs.
Run: `scanflow agent run scanflow.standard.executor:agent --port 8004 --peer tracker=http://127.0.0.1:8001`.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from fastapi import Depends

from scanflow import messages
from scanflow.agent import Agent, Context, PermanentError, TemporaryError, get_context
from scanflow.agentkit.detectors import model_name_of
from scanflow.agentkit.env import primary_service
from scanflow.platform.base import PlatformError
from scanflow.standard import executor_delivery
from scanflow.standard.executor_platform import RECONCILE_S, deploy_services, open_platform, reconcile_sizes
from scanflow.standard.model_loads import ModelLoads
from scanflow.standard.retrain_rows import drift_rows, log_serving_reference
from scanflow.standard.retraining import (
    DRIFT_PARAM,
    HOLDOUT_FRACTION,
    PATH_PARAM,
    VALIDATION_PARAM,
    distinct_rows,
    train_once,
)
from scanflow.tracking import monitoring

CHAMPION_ALIAS = "champion"
agent = Agent("executor", role="executor", description="runs jobs, promotes models, scales, routes",
              settings_keys=("holdout_fraction", "duplicate_tolerance", "reference_rows", "serving_wait_s", "promotion",
                             "readback_s"),
              messages=messages.receiving("plan.approved"), needs_workflow=True,
              emits=("image.outdated",))  # to itself, at start-up: never accepted on POST /events


def platform(ctx: Context) -> Any:
    """The platform `start_platform` opened (kept in ctx.resources); TemporaryError while it starts."""
    plat = ctx.resources.get("platform")
    if plat is None:
        raise TemporaryError("the platform is still starting", delay_s=2.0)
    return plat


def _plan(ctx: Context, args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(plan id, plan): the triggering event's payload (plus args), keyed by its inbox id."""
    p = {**(ctx.event.payload if ctx.event else {}), **args}
    pid = str(ctx.event.id) if ctx.event else str(args.get("plan_id") or ctx.key)
    return pid, p


def _typed_plan(ctx: Context, args: dict[str, Any], model: Any, actuator: str) -> Any:
    """The plan (`_plan`) as its typed message (scanflow.messages); PermanentError naming the field."""
    try:
        return messages.parse("plan.approved", _plan(ctx, args)[1], model)
    except messages.MessageError as exc:
        raise PermanentError(f"{actuator}: {exc}") from None


def _model_name(ctx: Context) -> str:
    return model_name_of(ctx.workflow)


def _loads(ctx: Context) -> ModelLoads:
    """The gate's models of this agent's workflow, loaded ahead (model_loads.py); one per running agent."""
    loads = ctx.resources.get("loads")
    if loads is None:
        loads = ctx.resources.setdefault("loads", ModelLoads(_model_name(ctx)))
    return loads  # type: ignore[no-any-return]


@agent.on_startup
def start_platform(ctx: Context) -> None:
    """Open the platform SCANFLOW_PLATFORM names, adopt what already runs, deploy what is missing
    (scanflow.standard.executor_platform), then ask for each upgrade the adoption left: an adopted
    service whose image is not the configured one gets an `image.outdated` event, which the
    `execute-upgrade` strategy below rolls (a decision on GET /decisions, like every other change)."""
    monitoring.start_monitoring(ctx.state, _monitors(ctx))
    plat = open_platform(ctx)
    ctx.resources["platform"] = plat
    for up in deploy_services(ctx, plat):
        ctx.log.info("service %s runs %s, configured %s: rolling it", up.service, up.running, up.configured)
        ctx.emit_sync("image.outdated", messages.ImageOutdated(**dataclasses.asdict(up)).payload(),
                      key=f"image.outdated:{up.service}:{up.running}:{up.configured}")


agent.strategy("execute-upgrade", event="image.outdated", actions=["upgrade_image"])


@agent.actuator("upgrade_image")
def upgrade_image(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Roll a service onto the configured image (surge 1, unavailable 0), then report what its replicas
    run. The event only names the service: the image comes from the configuration again (the
    declaration, else the platform's), never from the payload, so whoever may post an event cannot
    choose what the replicas run. Only platforms that run images have `set_image`."""
    from scanflow.platform.adoption import image_upgrades

    name = messages.parse("image.outdated", {**(ctx.event.payload if ctx.event else {}), **args}).service
    spec = next((s for s in ctx.workflow.services if s.name == name), None)
    if spec is None:
        raise PermanentError(f"upgrade_image: the workflow has no service {name!r}")
    plat = platform(ctx)
    if not hasattr(plat, "set_image"):
        raise PermanentError(f"upgrade_image: the platform {type(plat).__name__} runs no images")
    try:
        ups = image_upgrades([spec], plat.services(), getattr(plat, "image", None))
        if not ups:
            return {"service": name, "rolled": False, "reason": "it runs the configured image"}
        st = plat.set_image(name, ups[0].configured)
    except PlatformError as exc:
        raise PermanentError(f"upgrade_image {name!r}: {exc}") from None
    return {"service": name, "rolled": True, "from": ups[0].running, "to": ups[0].configured,
            "ready": st.ready_replicas}


# Kubernetes: pods started since an in-place resize are brought to their service's size
agent.sensor(every=RECONCILE_S)(reconcile_sizes)


@agent.on_shutdown
def stop_platform(ctx: Context) -> None:
    plat = ctx.resources.pop("platform", None)
    if plat is not None:
        plat.close()
    monitoring.stop_monitoring(ctx.state, _monitors(ctx))


def _monitors(ctx: Context, services: list[str] | None = None) -> list[monitoring.MonitorTarget]:
    """The monitoring runs in MLflow of the workflow's services (or of `services`), for the UI."""
    wf = ctx.workflow
    return [monitoring.monitor_target(wf.name, s.name, ctx.settings.home) for s in wf.services
            if services is None or s.name in services]


def _primary_monitor(ctx: Context) -> monitoring.MonitorTarget:
    """The monitoring run of the service the Checker watches, where its drift checks are."""
    return monitoring.monitor_target(ctx.workflow.name, primary_service(ctx.workflow).name, ctx.settings.home)


# -- S1 ------------------------------------------------------------------------------------------
def _planner_settings(wf: Any) -> dict[str, Any]:
    """The settings of the workflow's Planner (the promotion keys live there; the Executor's own win)."""
    return next((dict(a.settings) for a in wf.agents if a.role == "planner"), {})


def _setting(ctx: Context, key: str, default: Any) -> Any:
    return ctx.spec.settings.get(key, default)


@agent.actuator("retrain", max_attempts=3)
def retrain(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Train a challenger on the plan's critical points that feedback labelled, once per plan (`train_once`).

    A share of them (`holdout_fraction`, 0.3) is held out: the promotion gate's drifted part."""
    pid = _plan(ctx, args)[0]
    plan: messages.RetrainPlan = _typed_plan(ctx, args, messages.RetrainPlan, "retrain")
    ids = set(plan.critical_ids)
    _loads(ctx).prefetch_champion()  # the champion's model and reference: the schema now, the gate next
    ref = _loads(ctx).champion_reference()
    rows = drift_rows(ctx, ids, plan.from_seq or 0, ref.schema.task)
    distinct = distinct_rows(rows.x_labelled, float(_setting(ctx, "duplicate_tolerance", 0.0)))
    x, y = rows.x_labelled[distinct], rows.y_labelled[distinct]
    if len(x) < 10:
        raise PermanentError(f"only {len(x)} distinct labelled critical rows (feedback labelled {rows.labelled_requests} "
                             f"of {rows.critical_requests} critical requests): not retraining")
    rng = np.random.default_rng(int(pid) if pid.isdigit() else 0)
    order = rng.permutation(len(x))
    n_hold = int(len(x) * float(_setting(ctx, "holdout_fraction", HOLDOUT_FRACTION)))
    hold, fit = order[:n_hold], order[n_hold:]
    plans_dir = Path(ctx.settings.home).resolve() / "plans"
    plans_dir.mkdir(parents=True, exist_ok=True)
    extra, holdout, drift = (plans_dir / f"plan-{pid}-{part}.npz" for part in ("train", "holdout", "drift"))
    np.savez(extra, x=x[fit], y=y[fit])
    np.savez(holdout, x=x[hold], y=y[hold])
    np.savez(drift, x=rows.x_recent)
    job = ctx.workflow.jobs[0]
    tracking_uri = os.environ.get("MLFLOW_TRACKING_URI") or ctx.settings.tracking_uri or ""
    version, run_id, outputs, reused = train_once(
        platform(ctx), job, {PATH_PARAM: str(extra), VALIDATION_PARAM: str(holdout), DRIFT_PARAM: str(drift),
                          "alias": "challenger"},
        str(plans_dir / f"plan-{pid}"), ctx.key, tracking_uri, _model_name(ctx))
    ctx.state.setdefault("plans", {})[pid] = {"version": version, "run_id": run_id, "holdout": str(holdout),
                                              "drift": str(drift), "train": str(extra),
                                              "n_train_extra": len(fit), "n_holdout": len(hold)}
    monitoring.safe(ctx.state, "link the training run", monitoring.link_retrain, _model_name(ctx), version, run_id, pid,
                    plan.payload(), _primary_monitor(ctx), {"n_train": len(fit), "n_holdout": len(hold),
                                                  "labelled": rows.labelled_requests,
                                                  "critical": rows.critical_requests})
    monitoring.WRITER.submit(ctx.state, _primary_monitor(ctx), {"action/challenger_version": float(version)},
                             monitoring.plan_step(pid))
    scores = {k: v for k, v in outputs.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return {"plan": pid, "version": version, "run_id": run_id, "reused_run": reused, "n_extra": len(fit),
            "n_holdout": len(hold), "labelled_requests": rows.labelled_requests,
            "critical_requests": rows.critical_requests, "recent_rows": len(rows.x_recent), "job_scores": scores}


@agent.actuator("evaluate_and_promote", max_attempts=3)
def evaluate_and_promote(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Challenger vs champion, on the champion's clean reference holdout and on the plan's holdout of
    labelled drifted rows (feedback observed after the drift onset, never trained on); promoted when the
    promotion policy says it is better (the reason goes to the alias history in MLflow)."""
    from scanflow.policies.retrain import PromotionConfig, decide_promotion
    from scanflow.tracking.registry import set_alias

    pid = _plan(ctx, args)[0]
    plan: messages.RetrainPlan = _typed_plan(ctx, args, messages.RetrainPlan, "evaluate_and_promote")
    rec = ctx.state.get("plans", {}).get(pid)
    if rec is None:
        raise PermanentError(f"plan {pid}: no trained challenger (retrain did not succeed)")
    name, challenger = _model_name(ctx), rec["version"]
    champion = _loads(ctx).champion()
    if champion == challenger:  # promoted by an earlier attempt of this very step
        rec["promoted"] = True
        return {"plan": pid, "promoted": True, "version": challenger, "reason": "already champion"}
    for v in (challenger, champion):  # both load at once (the champion most likely already loaded)
        _loads(ctx).model(v)
    ref = _loads(ctx).champion_reference()
    with np.load(rec["holdout"]) as h:
        x_d, y_d = h["x"], h["y"]
    task = ref.schema.task
    ch = _loads(ctx).evaluate(challenger, ref.x_holdout, ref.y_holdout, x_d, y_d, task)
    cur = _loads(ctx).evaluate(champion, ref.x_holdout, ref.y_holdout, x_d, y_d, task)
    c = dict(_setting(ctx, "promotion", _planner_settings(ctx.workflow).get("promotion", {})))
    decision = decide_promotion(ch, cur, PromotionConfig(float(c.get("min_gain_drifted", 0.0)),
                                                         float(c.get("clean_tolerance", 0.01))))
    metric = ch.metric
    metrics = {f"challenger_{metric}_clean": ch.clean, f"challenger_{metric}_drifted": ch.drifted,
               f"champion_{metric}_clean": cur.clean, f"champion_{metric}_drifted": cur.drifted,
               "gate_rows_clean": float(len(ref.x_holdout)), "gate_rows_drifted": float(len(x_d))}
    svc = primary_service(ctx.workflow)
    progressive = decision.promote and svc.delivery.mode == "progressive"
    if decision.promote:
        rec["serving_reference"] = log_serving_reference(ctx, ref, rec, plan)
        if progressive:  # live stages first (scanflow/standard/executor_delivery.py); the Planner promotes
            rec["delivery"] = _start_delivery(ctx, svc, challenger, pid)["challenger"]
        else:
            set_alias(name, CHAMPION_ALIAS, challenger, actor="executor", reason=decision.reason, metrics=metrics)
    rec["promoted"] = decision.promote and not progressive
    rec["evaluation"] = metrics
    monitoring.safe(ctx.state, "record the promotion gate", monitoring.record_gate, name, challenger,
                    rec.get("run_id"), pid, plan.payload(), metrics, decision.promote, decision.reason, champion)
    monitoring.WRITER.submit(ctx.state, _primary_monitor(ctx), {"action/promoted": float(decision.promote),
                                                                **{f"gate/{k}": v for k, v in metrics.items()}},
                             monitoring.plan_step(pid))
    _loads(ctx).keep_only(challenger if rec["promoted"] else champion)
    return {"plan": pid, "promoted": rec["promoted"], "passed_gate": decision.promote, "version": challenger,
            "previous": champion, "delivery": rec.get("delivery"), "reason": decision.reason, "metric": metric,
            **metrics}


@agent.actuator("swap_model", max_attempts=3)
def swap_model(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    pid, _p = _plan(ctx, args)
    rec = ctx.state.get("plans", {}).get(pid, {})
    if "version" in args:
        version = str(args["version"])
    elif rec.get("promoted"):
        version = rec["version"]
    else:
        return {"plan": pid, "swapped": [], "reason": "nothing promoted by this plan"}
    swapped = _swap_to(ctx, version)
    monitoring.safe(ctx.state, "record the swap", monitoring.record_swap, _model_name(ctx), version,
                    rec.get("run_id"), swapped)
    for target in _monitors(ctx, swapped):
        monitoring.WRITER.submit(ctx.state, target, {"action/swapped_version": float(version)},
                                 monitoring.plan_step(pid))
    return {"plan": pid, "version": version, "swapped": swapped}


def _swap_to(ctx: Context, version: str) -> list[str]:
    """Every service serving this model hot-swaps to `version` (those already on it are left); the names
    of the services swapped."""
    uri = f"models:/{_model_name(ctx)}/{version}"
    swapped = []
    for svc in ctx.workflow.services:
        if _model_name(ctx) not in svc.model_uri:
            continue
        st = platform(ctx).status(svc.name)
        if st.replicas and all(r.model_version == version for r in st.replicas if r.ready):
            continue  # already serving it (an earlier attempt got this far)
        try:
            platform(ctx).swap_model(svc.name, uri)
        except PlatformError as exc:
            raise TemporaryError(str(exc), delay_s=2.0) from None
        swapped.append(svc.name)
    return swapped


def _start_delivery(ctx: Context, svc: Any, version: str, why: str) -> dict[str, Any]:
    deliveries = ctx.state.setdefault("deliveries", {})
    try:
        return executor_delivery.start(platform(ctx), svc, _model_name(ctx), version, deliveries, cause=why)
    except executor_delivery.DeliveryRefused as exc:
        raise PermanentError(str(exc)) from None
    except PlatformError as exc:
        if not exc.retryable:
            raise PermanentError(f"delivery of v{version} could not start: {exc}") from None
        raise TemporaryError(f"delivery of v{version} could not start: {exc}", delay_s=5.0) from None


@agent.actuator("start_delivery", max_attempts=3)
def start_delivery(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """An operator's progressive delivery of a registered version (`version`) to the primary service (or
    `service`), without a retrain: the same stages and live judgement as a retrained challenger's, from
    the first stage; refused while another delivery runs for that service."""
    version, name = str(args.get("version") or ""), args.get("service") or primary_service(ctx.workflow).name
    if not version.isdigit():
        raise PermanentError(f"start_delivery: 'version' must be a registered version number, got {version!r}")
    try:
        svc = ctx.workflow.service(str(name))
    except KeyError as exc:
        raise PermanentError(str(exc)) from None
    from scanflow.tracking.registry import get_alias_version

    if get_alias_version(_model_name(ctx), CHAMPION_ALIAS) == version:
        raise PermanentError(f"start_delivery: v{version} is the champion already")
    rec = _start_delivery(ctx, svc, version, f"operator: {ctx.key}")
    return {"service": svc.name, "challenger": rec["challenger"], "version": version, "stage": rec["kind"],
            "share": rec["share"]}


@agent.sensor(every=RECONCILE_S)
def tend_deliveries(ctx: Context) -> None:
    """Each running delivery's stage is put on the gateways again (a restarted gateway gets its challenger
    back), one that ended half-way is finished, and one with no verdict long past its declared timeouts is
    rolled back (executor_delivery.tend_all)."""
    plat = ctx.resources.get("platform")
    if plat is not None:
        executor_delivery.tend_all(
            plat, ctx.state.get("deliveries") or {}, ctx.workflow, lambda metrics: _promoter(ctx, metrics),
            lambda version, why: monitoring.safe(ctx.state, "record the rollback", monitoring.record_rollback,
                                                 _model_name(ctx), version, why), ctx.log)


def _promoter(ctx: Context, metrics: dict[str, float]) -> Any:
    """promote(version, reason) of a delivery: the champion alias moved (with the live figures `metrics`),
    every service of the model swapped, the services swapped returned. Repeatable (a retry after a failure)."""
    from scanflow.tracking.registry import set_alias

    name = _model_name(ctx)

    def promote(version: str, reason: str) -> list[str]:
        set_alias(name, CHAMPION_ALIAS, version, actor="executor", reason=f"progressive delivery: {reason}",
                  metrics=metrics)
        swapped = _swap_to(ctx, version)
        monitoring.safe(ctx.state, "record the swap", monitoring.record_swap, name, version, None, swapped)
        _loads(ctx).keep_only(version)
        return swapped
    return promote


@agent.actuator("deliver", max_attempts=3)
def deliver(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """A progressive delivery's next step, as the Planner judged it (scanflow/standard/executor_delivery.py):
    the challenger to its next stage on the gateway; or promoted (the champion alias, with the live
    figures in its history, and every service of the model swapped) and its replicas removed; or rolled
    back (its replicas removed, the rollback tagged on its version)."""
    p: messages.DeliveryPlan = _typed_plan(ctx, args, messages.DeliveryPlan, "deliver")
    name, promote = _model_name(ctx), _promoter(ctx, executor_delivery.numeric(p.figures))

    def rolled_back(version: str, reason: str) -> None:
        monitoring.safe(ctx.state, "record the rollback", monitoring.record_rollback, name, version, reason)

    try:
        return executor_delivery.apply(platform(ctx), ctx.state.setdefault("deliveries", {}), p, promote, rolled_back)
    except PlatformError as exc:
        raise TemporaryError(str(exc), delay_s=2.0) from None


# -- S2/S3/S4 ------------------------------------------------------------------------------------
@agent.actuator("route")
def route(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    p = _typed_plan(ctx, args, messages.RoutePlan, "route")
    service = p.service or next((s.name for s in ctx.workflow.services if s.backup), None)
    if not service:
        raise PermanentError("route needs 'service' (no service of the workflow declares a backup)")
    try:
        st = platform(ctx).route(service, p.to)
    except PlatformError as exc:
        raise PermanentError(str(exc)) from None
    return {"service": service, "to": p.to, "routed_to": st.routed_to, "reason": p.reason}


@agent.actuator("scale")
def scale(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    p = _typed_plan(ctx, args, messages.ScalePlan, "scale")
    try:
        st = platform(ctx).scale(p.service, p.replicas)
    except PlatformError as exc:
        raise PermanentError(str(exc)) from None
    for target in _monitors(ctx, [st.name]):
        monitoring.WRITER.submit(ctx.state, target, {"action/replicas": float(st.desired_replicas)},
                                 monitoring.next_step(ctx.state, "scale"))
    return {"service": st.name, "replicas": st.desired_replicas, "ready": st.ready_replicas}


READBACK_S = 15.0  # how long set_resources waits for the replicas to show the change (a replica's /info, a pod's status)


@agent.actuator("set_resources")
def set_resources(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Apply a `resources` plan, then read back what really took effect before reporting success.

    The plan: {"service", "resources": {"cpu", "memory"}, "threads"?, "affinity"?}. The platform applies
    it (local: cgroup quota + affinity + the replica's thread pool; Kubernetes: in-place pods/resize,
    else a rollout) and says what the replicas must show (`ResourceChange.wanted`); its status is then
    read until they show it (`readback_s`, 15 s). A replica that still differs fails the step with what
    differs (PermanentError: applying the same plan again would not change the kernel's or the
    kubelet's answer), so an audit log never shows a resources plan as done that did not happen. A
    platform that cannot say what to read back (`wanted` None) fails the step too, saying it applied
    the change unverified: success is only ever a change read back."""
    from scanflow.platform.readback import compare

    p = _typed_plan(ctx, args, messages.ResourcesPlan, "set_resources")
    service = p.service
    try:
        change = platform(ctx).set_resources(service, p.resources, p.affinity, p.threads)
    except (ValueError, PlatformError) as exc:
        raise PermanentError(f"set_resources: {exc}") from None
    out = dataclasses.asdict(change)
    out.pop("wanted", None)
    if change.wanted is None:
        # nothing to compare with: the change may or may not have taken effect, and a step reported done
        # must mean it did, so the step fails and says so (the platform applied what it could)
        raise PermanentError(
            f"set_resources on {service!r}: applied ({change.method}) but NOT verified: the platform "
            f"{type(platform(ctx)).__name__} did not say what its replicas must show (ResourceChange.wanted is "
            "None), so nothing could be read back" + (f" (notes: {'; '.join(change.notes)})" if change.notes else ""))
    deadline = time.monotonic() + float(_setting(ctx, "readback_s", READBACK_S))
    while True:
        got = compare(change.wanted, platform(ctx).status(service))
        if got.ok or time.monotonic() >= deadline:
            break
        time.sleep(0.25)  # polling the OS / the API server: nothing announces a cgroup or a pod change
    out.update({"verified": got.ok, "observed": got.observed})
    if not got.ok:
        raise PermanentError(f"set_resources on {service!r}: applied ({change.method}) but read back differs: "
                             + "; ".join(got.mismatches) + (f" (notes: {'; '.join(change.notes)})" if change.notes else ""))
    return out


@agent.router.get("/services")
async def services(ctx: Annotated[Context, Depends(get_context)]) -> Any:
    """What the platform runs: each service's status (replicas, pids, cores, model versions, route), and
    the challenger's service while a progressive delivery runs.
    503 with a message while the platform is still starting (deploying the services)."""
    import asyncio

    from fastapi.responses import JSONResponse

    plat = ctx.resources.get("platform")
    if plat is None:
        return JSONResponse({"detail": "the platform is still starting (deploying the services); retry shortly"},
                            status_code=503, headers={"Retry-After": "2"})
    out = {}
    running = [d["challenger"] for d in (ctx.state.get("deliveries") or {}).values() if d.get("state") == "running"]
    for name in [svc.name for svc in ctx.workflow.services] + running:  # and a progressive delivery's challenger
        try:
            out[name] = dataclasses.asdict(await asyncio.to_thread(plat.status, name))
        except PlatformError as exc:
            out[name] = {"error": str(exc)}
    return out
