"""Planner: decides what to change, with the pure policies of scanflow.policies; every decision says why.

- `plan_retrain` (on each `drift.checked` the Checker forwards): retrain policy (drift in k of the
  last m windows, no retrain running, cooldown). When it says retrain, it emits `drift.detected`
  carrying the critical points of the drifted windows; the workflow's `retrain-on-drift` strategy
  (its own cooldown) then runs `submit_plan`, which hands the plan to the Executor's inbox.
- `plan_failover` (on `service.checked`): failover policy with hysteresis (fail over after N failed
  checks, return after M healthy ones) -> a `route` plan for the Executor.
- `plan_scale` (on `latency.breached`): autoscale policy (latency vs SLO, queue depth) -> `scale`.
Policy states live in the agent's persisted state, so a restarted Planner keeps its hysteresis.
`GET /plans` lists the policy decisions (reason, inputs) newest last.
Run: `scanflow agent run agents/planner.py --port 8003 --peer executor=http://127.0.0.1:8004`.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

from fastapi import Depends

from scanflow.agent import Agent, Context, PermanentError, get_context
from scanflow.embedded.env import agent_spec, primary_service, quick
from scanflow.policies import autoscale, failover, retrain
from scanflow.policies.types import Streak

SPEC = agent_spec("planner")
CFG = SPEC.settings
MAX_DECISIONS = 200
MAX_CRITICAL = 4000
agent = Agent(SPEC.name, role="planner", description="retrain, failover and scaling decisions")
for _s in SPEC.strategies:
    agent.add_strategy(_s)


def _record(ctx: Context, policy: str, decision: Any, **extra: Any) -> dict[str, Any]:
    rec = {"policy": policy, "at": ctx.now(), "key": ctx.key, **decision.to_dict(), **extra}
    ctx.state["decisions"] = [*ctx.state.get("decisions", []), rec][-MAX_DECISIONS:]
    return rec


def _payload(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    return {**(ctx.event.payload if ctx.event else {}), **args}


@agent.actuator("plan_retrain")
def plan_retrain(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    p = _payload(ctx, args)
    if "drift" not in p:
        raise PermanentError("plan_retrain needs a drift verdict: {'drift': bool, 'critical_ids': [...]}")
    c = dict(CFG.get("retrain", {}))
    config = retrain.RetrainConfig(k=int(c.get("k", 2)), m=int(c.get("m", 3)),
                                   cooldown_s=float(c.get("cooldown_s", 600.0)))
    st = ctx.state.get("retrain", {})
    state = retrain.RetrainState(tuple(st.get("windows", ())), st.get("last_retrain_at"))
    decision, new = retrain.decide(retrain.RetrainContext(
        now=ctx.now(), drift=bool(p["drift"]), drift_score=p.get("score"), config=config, state=state))
    # critical points of the windows that count: drifted windows only, cleared after a retrain
    pool = list(ctx.state.get("critical_ids", [])) + (list(p.get("critical_ids", [])) if p["drift"] else [])
    ctx.state["critical_ids"] = pool[-MAX_CRITICAL:]
    ctx.state["retrain"] = {"windows": list(new.windows), "last_retrain_at": new.last_retrain_at}
    rec = _record(ctx, "retrain", decision)
    if decision.retrain:
        ctx.state["critical_ids"] = []
        ctx.emit_sync("drift.detected", {"reason": decision.reason, "critical_ids": pool[-MAX_CRITICAL:],
                                         "drift_rate": p.get("drift_rate"), "score": p.get("score")})
    return {"retrain": decision.retrain, "reason": decision.reason, "decision_at": rec["at"]}


@agent.actuator("submit_plan", max_attempts=10)  # the Executor may be redeploying (~30 s)
async def submit_plan(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Hand a plan to the Executor's durable inbox as `plan.approved` (deduplicated by key on retry)."""
    plan = {**(ctx.event.payload if ctx.event else {}), **args}
    if "plan" not in plan:
        raise PermanentError("submit_plan needs args.plan ('retrain', 'route', 'scale', 'resources')")
    got = await ctx.send_event("executor", "plan.approved", plan)
    return {"plan": plan["plan"], **got}


@agent.actuator("plan_failover", max_attempts=6)
async def plan_failover(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    p = _payload(ctx, args)
    c = dict(CFG.get("failover", {}))
    config = failover.FailoverConfig(int(c.get("fail_checks", 3)), int(c.get("recover_checks", 5)))
    st = ctx.state.get("failover", {})
    state = failover.FailoverState(st.get("routed_to", "primary"), Streak(**st.get("streak", {})),
                                   st.get("changed_at"))
    decision, new = failover.decide(failover.FailoverContext(
        now=ctx.now(), primary_healthy=bool(p.get("primary_healthy", True)),
        backup_healthy=bool(p.get("backup_healthy", True)), config=config, state=state))
    ctx.state["failover"] = {"routed_to": new.routed_to, "streak": dataclasses.asdict(new.primary),
                             "changed_at": new.changed_at}
    if decision.changed:
        svc = primary_service()
        to = svc.backup if decision.route_to == "backup" else None
        await ctx.send_event("executor", "plan.approved",
                             {"plan": "route", "service": svc.name, "to": to, "reason": decision.reason})
    _record(ctx, "failover", decision)
    return {"route_to": decision.route_to, "changed": decision.changed, "reason": decision.reason}


@agent.actuator("plan_scale", max_attempts=6)
async def plan_scale(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    p = _payload(ctx, args)
    svc = primary_service()
    c = dict(CFG.get("autoscale", {}))
    known = {f.name for f in dataclasses.fields(autoscale.AutoscaleConfig)} - {"guardrails"}
    config = autoscale.AutoscaleConfig(**{k: v for k, v in c.items() if k in known})
    st = ctx.state.get("autoscale_replicas", p.get("replicas") or svc.replicas)
    decision, _new = autoscale.decide(autoscale.AutoscaleContext(
        now=ctx.now(), current_replicas=int(st), slo_latency_ms=float(p.get("slo_ms", 50.0)),
        latency_ms=p.get("latency_ms"), in_flight=float(p.get("in_flight", 0.0)), config=config))
    want = int(getattr(decision, "replicas", st))
    want = max(svc.min_replicas, min(svc.max_replicas, want))
    if want != int(st):
        ctx.state["autoscale_replicas"] = want
        await ctx.send_event("executor", "plan.approved",
                             {"plan": "scale", "service": svc.name, "replicas": want, "reason": decision.reason})
    _record(ctx, "autoscale", decision, quick=quick())
    return {"replicas": want, "reason": decision.reason}


@agent.router.get("/plans")
async def plans(ctx: Annotated[Context, Depends(get_context)]) -> list[dict[str, Any]]:
    """The policy decisions, oldest first (the strategies' decisions are at GET /decisions)."""
    return list(ctx.state.get("decisions", []))
