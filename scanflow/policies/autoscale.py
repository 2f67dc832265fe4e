"""Replica autoscaling on latency vs the SLO and on queue depth (not CPU): the Planner's S2 policy.

`decide(ctx) -> (ScaleDecision, AutoscaleState)` is pure: the caller (the Planner agent, the scaling
benchmark, a test) owns the clock and the metrics and passes them in; the state comes back out, so a
restarted Planner resumes with the same hysteresis.

Steps, in order:
1. raw desired value: the replicas the demand needs. With the arrival rate and the mean service time
   known, Little's law: (rate * service_time + backlog * service_time / drain_s) / target_utilization,
   where the backlog term drains the queue already built up within `drain_s`. Without them, the
   queue-depth estimate in_flight / target_in_flight (Ray Serve's target ongoing requests).
2. factors: latency above the SLO means overload -> at least one replica more than now (unless
   replicas are still starting, the last change is younger than `settle_s`, or the queue is
   shrinking since the last tick); latency in the band between `latency_low` * SLO and the SLO means
   "comfortable" -> never scale down; only below the band may the count fall, and below it a
   scale-up for headroom needs the demand to saturate the replicas now (rate noise never adds one).
3. down-scale stabilisation: a scale-down goes no lower than the largest raw value of the last
   `down_window_s` (as the HPA's stabilization window, shorter), so measurement noise cannot flap;
4. guardrails (bounds, cold start, hysteresis, cooldown, max step): `guardrails.apply_guardrails`.

Defaults: act fast on overload (1 tick, no delay, unbounded step), slow and sure on scale-down
(the largest need of the last 30 s, then 5 ticks and 30 s of agreeing ticks, then 60 s of cooldown
after any change before the next step down), so it never flaps on a step in load. A step down goes
straight to that stabilised need, which still leaves 30% headroom (target_utilization 0.7); set
`max_step_down` to go one replica at a time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal

from scanflow.policies.guardrails import Guardrails, GuardState, apply_guardrails
from scanflow.policies.types import Decision, slo_breached
from scanflow.spec import Service


def default_autoscale_guardrails() -> Guardrails:
    return Guardrails(
        min_replicas=1, max_replicas=8,
        up_ticks=1, up_delay_s=0.0, cooldown_up_s=0.0, max_step_up=None,
        down_ticks=5, down_delay_s=30.0, cooldown_down_s=60.0, max_step_down=None,
        cold_start_s=30.0,
    )


@dataclass(frozen=True)
class AutoscaleConfig:
    """Targets of the policy. `target_utilization` leaves headroom for bursts (0.7 = 30%)."""

    target_utilization: float = 0.7
    target_in_flight: float = 2.0  # per replica, used when rate or service time is unknown
    drain_s: float = 5.0  # drain an existing backlog within this many (nominal) seconds
    latency_low: float = 0.5  # below latency_low * SLO, scaling down is allowed
    settle_s: float = 10.0  # after a change, latency above the SLO alone adds no replica for this long
    down_window_s: float = 30.0  # a scale-down goes only to the max of the raw values over this window
    startup_s: float | None = 10.0  # how long a new replica takes to serve; None: unknown
    guardrails: Guardrails = field(default_factory=default_autoscale_guardrails)

    def __post_init__(self) -> None:
        if not 0 < self.target_utilization <= 1:
            raise ValueError(f"target_utilization must be in (0, 1], got {self.target_utilization}")
        if self.startup_s is not None and self.startup_s < 0:
            raise ValueError(f"startup_s must be >= 0 or None, got {self.startup_s}")
        if self.target_in_flight <= 0 or self.drain_s <= 0 or self.settle_s < 0 or self.down_window_s < 0:
            raise ValueError("target_in_flight and drain_s must be > 0, settle_s and down_window_s >= 0")
        if not 0 <= self.latency_low < 1:
            raise ValueError(f"latency_low must be in [0, 1), got {self.latency_low}")


def config_for(service: Service, *, time_scale: float = 1.0, **overrides: float) -> AutoscaleConfig:
    """The default config bounded by a declared service's min/max replicas (the Planner's usual call).

    `overrides` set AutoscaleConfig fields (e.g. target_utilization=0.6).
    """
    base = AutoscaleConfig(**overrides)  # type: ignore[arg-type]
    guard = replace(base.guardrails, min_replicas=service.min_replicas, max_replicas=service.max_replicas,
                    time_scale=time_scale)
    return replace(base, guardrails=guard)


@dataclass(frozen=True)
class AutoscaleState:
    guard: GuardState = field(default_factory=GuardState)
    recent: tuple[tuple[float, int], ...] = ()  # (time, raw desired) within down_window_s
    last_in_flight: float | None = None  # the previous tick's in_flight: is a backlog shrinking?


@dataclass(frozen=True)
class AutoscaleContext:
    """One tick's view of a service.

    latency_ms: the SLO percentile of requests completed in the last window (None: no traffic).
    latency_lower_bound: latency_ms is only a lower bound (the percentile fell past the histogram's
      top bucket): at the SLO it already counts as over it.
    in_flight: requests queued or executing, over all replicas, now.
    arrival_rate: requests per second arriving at the gateway in the last window (None: unknown).
    service_time_ms: mean processing time per request in a replica, queueing excluded (None: unknown).
    capacity_changed_at: when the replicas' capacity last changed otherwise (a vertical resize by
      scanflow.policies.elastic): latency above the SLO adds no replica within `settle_s` of it either.
    spare_cpu: the replicas measurably had CPU to spare this tick (scanflow.policies.elastic reads it from
      their cgroups: under their limit, hardly throttled). Latency over the SLO is then not theirs: a busy
      host's contention or a burst's tail, which another replica on the same host does not serve
      faster. It adds no replica by itself; the rate estimate still may (band "over-slo-spare").
    """

    now: float
    current_replicas: int
    slo_latency_ms: float
    latency_ms: float | None = None
    latency_lower_bound: bool = False
    in_flight: float = 0.0
    arrival_rate: float | None = None
    service_time_ms: float | None = None
    ready_replicas: int | None = None
    capacity_changed_at: float | None = None  # another capacity change (an in-place resize) settling too
    spare_cpu: bool = False
    config: AutoscaleConfig = field(default_factory=AutoscaleConfig)
    state: AutoscaleState = field(default_factory=AutoscaleState)

    def __post_init__(self) -> None:
        if self.current_replicas < 0:
            raise ValueError(f"current_replicas must be >= 0, got {self.current_replicas}")
        if self.slo_latency_ms <= 0:
            raise ValueError(f"slo_latency_ms must be > 0, got {self.slo_latency_ms}")
        if self.in_flight < 0:
            raise ValueError(f"in_flight must be >= 0, got {self.in_flight}")


@dataclass(frozen=True)
class ScaleDecision(Decision):
    replicas: int = 0
    current: int = 0
    action: Literal["up", "down", "hold"] = "hold"


def needed_replicas(ctx: AutoscaleContext, utilization: float | None = None) -> tuple[int, str]:
    """Step 1: the replicas the demand needs now at `utilization` (default: the target), and which
    estimate gave it.

    While replicas asked for earlier are still starting, the backlog term is left out: the backlog
    built up during their start-up is theirs to drain, and counting it again each tick would climb
    to the maximum. Only the backlog the present replicas cannot drain within `startup_s` counts:
    a replica added for the rest would arrive after it is gone.
    """
    cfg = ctx.config
    if ctx.arrival_rate is not None and ctx.service_time_ms is not None:
        s = ctx.service_time_ms / 1000.0
        drain = cfg.drain_s / cfg.guardrails.time_scale
        starting = ctx.ready_replicas is not None and ctx.ready_replicas < ctx.current_replicas
        work = 0.0 if starting else ctx.in_flight * s  # core-seconds queued
        if work and cfg.startup_s is not None:
            # what the replicas there are drain (at full utilization) before a new one could serve
            spare = max(0.0, ctx.current_replicas - ctx.arrival_rate * s)
            work = max(0.0, work - spare * cfg.startup_s / cfg.guardrails.time_scale)
        busy = ctx.arrival_rate * s + work / drain
        return max(1, math.ceil(busy / (utilization or cfg.target_utilization) - 1e-9)), "rate"
    return max(1, math.ceil(ctx.in_flight / cfg.target_in_flight - 1e-9)), "queue"


def decide(ctx: AutoscaleContext) -> tuple[ScaleDecision, AutoscaleState]:
    """This tick's replica count for the service, with the reason and the inputs."""
    cfg = ctx.config
    current = ctx.current_replicas
    ready = current if ctx.ready_replicas is None else ctx.ready_replicas
    estimate, source = needed_replicas(ctx)
    slo = ctx.slo_latency_ms
    last_change = max((t for t in (ctx.state.guard.last_change_at, ctx.capacity_changed_at) if t is not None),
                      default=None)
    settling = last_change is not None and ctx.now - last_change < cfg.settle_s / cfg.guardrails.time_scale
    over = slo_breached(ctx.latency_ms, slo, ctx.latency_lower_bound)
    if over and ctx.spare_cpu:
        band = "over-slo-spare"
        raw = max(estimate, current)  # as "comfortable": up on the estimate, never down
    elif over:
        band = "over-slo"
        # Overload: at least one more than now, unless replicas already asked for are still starting,
        # the last change is too recent to show, or the queue is shrinking (latency is then the tail
        # of a backlog being drained, and one more replica would arrive after it is gone).
        prev = ctx.state.last_in_flight
        draining = prev is not None and ctx.in_flight < prev
        raw = max(estimate, current if ready < current or settling or draining else current + 1)
    elif ctx.latency_ms is not None and ctx.latency_ms > cfg.latency_low * slo:
        band = "comfortable"
        raw = max(estimate, current)  # may scale up ahead of a breach, never down
    else:
        band = "low"
        # Latency is low: go up for headroom only when the demand would saturate the replicas
        # (utilization 1.0); otherwise rate noise near a ceil boundary would add and remove replicas.
        saturated, _ = needed_replicas(ctx, utilization=1.0)
        raw = estimate if estimate <= current or saturated > current else current
    # Down-scale stabilisation: the largest raw value of the last down_window_s, so the noise of a
    # rate measured over one tick (the ceil of 5.1 vs 4.9) never removes a replica the next tick re-adds.
    window = cfg.down_window_s / cfg.guardrails.time_scale
    recent = tuple((t, r) for t, r in ctx.state.recent if ctx.now - t < window) + ((ctx.now, raw),)
    if raw < current:
        raw = min(current, max(r for _, r in recent))
    outcome = apply_guardrails(raw, current, ctx.now, cfg.guardrails, ctx.state.guard)
    target = outcome.replicas
    action: Literal["up", "down", "hold"] = "up" if target > current else "down" if target < current else "hold"
    reason = f"{action}: latency {band}, {source} estimate {estimate}, raw {raw}; {outcome.step}: {outcome.detail}"
    inputs = {
        "now": ctx.now, "current_replicas": current, "ready_replicas": ready,
        "latency_ms": ctx.latency_ms, "latency_lower_bound": ctx.latency_lower_bound, "slo_latency_ms": slo,
        "in_flight": ctx.in_flight,
        "arrival_rate": ctx.arrival_rate, "service_time_ms": ctx.service_time_ms,
        "estimate": estimate, "estimate_source": source, "band": band, "raw_desired": raw,
        "guardrail": outcome.step,
    }
    return (
        ScaleDecision(reason=reason, inputs=inputs, replicas=target, current=current, action=action),
        AutoscaleState(guard=outcome.state, recent=recent, last_in_flight=ctx.in_flight),
    )
