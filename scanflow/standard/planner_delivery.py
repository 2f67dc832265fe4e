"""The Planner's delivery decisions: each `delivery.checked` judged by scanflow.policies.delivery against
the service's declared delivery, and a `delivery` plan for the Executor when a stage ends.

Who calls: the Planner's `plan_delivery` actuator (scanflow/standard/planner.py). The policy's state (the
stage, when it began, whether the challenger was shown not worse) is kept per delivery in the Planner's
persisted state, so a restarted Planner resumes the stage it was in; a new delivery (another challenger
URL or another time it was set) starts from its first stage.
"""

from __future__ import annotations

from typing import Any

from scanflow import messages
from scanflow.agent import Context
from scanflow.policies import delivery
from scanflow.policies.delivery import (
    DeliveryConfig,
    DeliveryDecision,
    DeliveryState,
    LiveFigures,
    OutcomeSums,
    Stage,
)
from scanflow.policies.types import state_from_json, state_to_json
from scanflow.spec import Service


def delivery_config(svc: Service) -> DeliveryConfig:
    """Pure: the policy's configuration from the service's `delivery` declaration."""
    d = svc.delivery
    return DeliveryConfig(stages=tuple(Stage(s.kind, s.share, s.min_labelled, s.min_seconds, s.timeout_s) for s in d.stages),
                          margin=d.margin, confidence=d.confidence, max_error_rate=d.max_error_rate,
                          latency_tolerance=d.latency_tolerance)


def live_figures(p: messages.DeliveryChecked) -> LiveFigures:
    """Pure: the policy's figures from the Checker's message."""
    def sums(s: messages.OutcomeSums) -> OutcomeSums:
        return OutcomeSums(s.n, s.total, s.total_sq)

    return LiveFigures(paired=sums(p.paired), challenger=sums(p.challenger), champion=sums(p.champion),
                       requests=p.requests, errors=p.errors, timed=p.timed, p99_ms=p.p99_ms, slo_p99_ms=p.slo_p99_ms,
                       champion_p99_ms=p.champion_p99_ms, champion_timed=p.champion_timed,
                       recent_p99_ms=p.recent_p99_ms, recent_timed=p.recent_timed,
                       champion_recent_p99_ms=p.champion_recent_p99_ms,
                       agreement=p.agreement)


def decide(ctx: Context, p: messages.DeliveryChecked) -> tuple[DeliveryDecision, messages.DeliveryPlan | None]:
    """One look at the delivery `p` reports: the decision, and the plan to send when a stage ends."""
    svc = ctx.workflow.service(p.service)
    if svc.delivery.mode != "progressive":
        return DeliveryDecision(f"service {svc.name!r} declares no progressive delivery: the challenger on its "
                                "gateway is someone else's to judge", action="hold"), None
    kept: dict[str, Any] = ctx.state.get("delivery") or {}
    state = state_from_json(DeliveryState, kept["state"]) if kept.get("delivery") == p.delivery else DeliveryState()
    decision, new = delivery.decide(delivery.DeliveryContext(ctx.now(), live_figures(p), delivery_config(svc), state))
    ctx.state["delivery"] = {"delivery": p.delivery, "state": state_to_json(new), "last": decision.reason}
    if decision.action == "hold":
        return decision, None
    plan = messages.DeliveryPlan(service=svc.name, challenger_service=p.challenger_service, delivery=p.delivery,
                                 action=decision.action, kind=decision.kind, share=decision.share, stage=decision.stage,
                                 reason=decision.reason, figures=decision.to_dict()["inputs"])
    return decision, plan


def monitoring_metrics(decision: DeliveryDecision) -> dict[str, float]:
    """Pure: the figures the Planner's monitoring run plots for a delivery (the bounds when known)."""
    i = decision.inputs
    out = {"delivery/stage": float(decision.stage), "delivery/share": float(decision.share),
           "delivery/labelled": float(i.get("labelled") or 0)}
    for key in ("paired_gap", "paired_low", "paired_high", "unpaired_gap", "unpaired_low", "unpaired_high", "p99_ms",
                "agreement"):
        if i.get(key) is not None:
            out[f"delivery/{key}"] = float(i[key])
    return out
