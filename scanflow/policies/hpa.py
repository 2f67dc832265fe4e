"""The Kubernetes HorizontalPodAutoscaler algorithm (autoscaling/v2, default behaviour), as a pure policy.

It is the baseline the Planner's autoscale policy must beat on S2, so it follows the documented
algorithm rather than an idealised one (kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale,
pkg/controller/podautoscaler/horizontal.go and replica_calculator.go):

- it acts once per sync period (15 s; `--horizontal-pod-autoscaler-sync-period`);
- usage ratio = metric / target (the metric is the average over ready pods, e.g. CPU utilization);
  within the tolerance (|ratio - 1| <= 0.1) nothing changes;
- desired = ceil(ratio * ready pods); when scaling up, pods not yet ready count as 0 usage, and a
  direction that flips once they are counted gives "no change";
- stabilization: scale-up window 0 s, scale-down window 300 s in which the recommendation is the
  maximum of the recommendations made during the window;
- rate limits: scale-up at most max(+4 pods, +100%) per 15 s period (selectPolicy Max); scale-down
  100% per 15 s; then min/max replicas.

`time_scale` divides every duration (sync period, windows, periods) so runs can be shortened; the
benchmark gives the Planner's policy the same factor. Who calls it: benchmarks/scaling.py and tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from scanflow.policies.guardrails import Guardrails, GuardState, apply_guardrails
from scanflow.policies.types import Decision


@dataclass(frozen=True)
class HpaConfig:
    min_replicas: int = 1
    max_replicas: int = 8
    target: float = 0.7  # target average metric per pod (e.g. 0.7 = 70% CPU utilization)
    tolerance: float = 0.1
    sync_period_s: float = 15.0
    scale_up_window_s: float = 0.0
    scale_down_window_s: float = 300.0
    scale_up_pods: int = 4
    scale_up_percent: float = 100.0
    scale_up_period_s: float = 15.0
    scale_down_percent: float = 100.0
    scale_down_period_s: float = 15.0
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.target <= 0 or self.tolerance < 0 or self.time_scale <= 0 or self.sync_period_s <= 0:
            raise ValueError("target, sync_period_s and time_scale must be > 0 and tolerance >= 0")
        if self.min_replicas < 1 or self.max_replicas < self.min_replicas:
            raise ValueError(f"need 1 <= min_replicas <= max_replicas, got {self.min_replicas}, {self.max_replicas}")

    def scaled(self, seconds: float) -> float:
        return seconds / self.time_scale


@dataclass(frozen=True)
class HpaState:
    last_sync_at: float | None = None
    recommendations: tuple[tuple[float, int], ...] = ()  # (time, recommended replicas)
    scale_events: tuple[tuple[float, int], ...] = ()  # (time, replicas added (>0) or removed (<0))
    guard: GuardState = field(default_factory=GuardState)


@dataclass(frozen=True)
class HpaContext:
    """metric: average over ready pods, in the unit of `config.target` (e.g. CPU utilization 0..1)."""

    now: float
    current_replicas: int
    metric: float
    ready_replicas: int | None = None
    config: HpaConfig = field(default_factory=HpaConfig)
    state: HpaState = field(default_factory=HpaState)

    def __post_init__(self) -> None:
        if self.current_replicas < 0 or self.metric < 0:
            raise ValueError("current_replicas and metric must be >= 0")


@dataclass(frozen=True)
class HpaDecision(Decision):
    replicas: int = 0
    current: int = 0
    action: Literal["up", "down", "hold"] = "hold"


def raw_recommendation(current: int, ready: int, metric: float, cfg: HpaConfig) -> tuple[int, str]:
    """replica_calculator: desired replicas from the usage ratio, tolerance and unready pods."""
    if ready <= 0:
        return current, "no ready pods: no metrics"
    ratio = metric / cfg.target
    if abs(ratio - 1.0) <= cfg.tolerance:
        return current, f"ratio {ratio:.3f} within tolerance {cfg.tolerance}"
    if ratio > 1.0 and ready < current:
        # Unready pods count as 0 usage when scaling up.
        new_ratio = metric * ready / current / cfg.target
        if new_ratio <= 1.0 or abs(new_ratio - 1.0) <= cfg.tolerance:
            return current, f"ratio {ratio:.3f} but {new_ratio:.3f} with unready pods at 0"
        return math.ceil(new_ratio * current - 1e-9), f"ratio {new_ratio:.3f} (unready pods at 0)"
    return math.ceil(ratio * ready - 1e-9), f"ratio {ratio:.3f}"


def decide(ctx: HpaContext) -> tuple[HpaDecision, HpaState]:
    """One HPA controller tick: hold between syncs; on a sync, recommend, stabilise, rate-limit."""
    cfg, st, now, current = ctx.config, ctx.state, ctx.now, ctx.current_replicas
    ready = current if ctx.ready_replicas is None else ctx.ready_replicas
    inputs = {"now": now, "current_replicas": current, "ready_replicas": ready, "metric": ctx.metric,
              "target": cfg.target}
    if st.last_sync_at is not None and now - st.last_sync_at < cfg.scaled(cfg.sync_period_s) - 1e-9:
        return HpaDecision(reason="hold: between syncs", inputs=inputs, replicas=current, current=current), st
    raw, why = raw_recommendation(current, ready, ctx.metric, cfg)

    # Stabilization: up = min over the up window, down = max over the down window (current one included).
    recs = tuple((t, r) for t, r in st.recommendations
                 if now - t < cfg.scaled(max(cfg.scale_up_window_s, cfg.scale_down_window_s)))
    up_rec = min([raw] + [r for t, r in recs if now - t < cfg.scaled(cfg.scale_up_window_s)])
    down_rec = max([raw] + [r for t, r in recs if now - t < cfg.scaled(cfg.scale_down_window_s)])
    stabilized = min(max(current, up_rec), down_rec)

    # Rate limits from the scale events of the current period.
    events = tuple((t, d) for t, d in st.scale_events
                   if now - t < cfg.scaled(max(cfg.scale_up_period_s, cfg.scale_down_period_s)))
    added = sum(d for t, d in events if d > 0 and now - t < cfg.scaled(cfg.scale_up_period_s))
    removed = -sum(d for t, d in events if d < 0 and now - t < cfg.scaled(cfg.scale_down_period_s))
    start_up = current - added
    up_limit = max(start_up + cfg.scale_up_pods, math.ceil(start_up * (1 + cfg.scale_up_percent / 100.0)))
    up_limit = max(up_limit, current)
    start_down = current + removed
    down_limit = min(current, math.ceil(start_down * (1 - cfg.scale_down_percent / 100.0)))
    limited = min(max(stabilized, down_limit), up_limit)

    # Bounds through the shared guardrails, with HPA's own rules already applied (no extra delays).
    guard_cfg = Guardrails(min_replicas=cfg.min_replicas, max_replicas=cfg.max_replicas,
                           time_scale=cfg.time_scale)
    outcome = apply_guardrails(limited, current, now, guard_cfg, st.guard)
    target = outcome.replicas
    delta = target - current
    action: Literal["up", "down", "hold"] = "up" if delta > 0 else "down" if delta < 0 else "hold"
    new_state = HpaState(
        last_sync_at=now,
        recommendations=recs + ((now, raw),),
        scale_events=events + (((now, delta),) if delta else ()),
        guard=outcome.state,
    )
    inputs.update(raw_recommendation=raw, stabilized=stabilized, up_limit=up_limit, limited=limited)
    reason = (f"{action}: {why} -> raw {raw}, stabilized {stabilized}, rate-limited {limited}; "
              f"{outcome.step}: {outcome.detail}")
    return HpaDecision(reason=reason, inputs=inputs, replicas=target, current=current, action=action), new_state
