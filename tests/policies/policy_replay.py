"""Replay scripted tick sequences through a policy (helpers of the policies tests).

The loop here plays the Planner's part: it owns the clock, feeds each tick's metrics in, applies the
decided replica count immediately, and carries the state from one tick into the next.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from scanflow.policies import autoscale, hpa


@dataclass(frozen=True)
class Tick:
    latency_ms: float | None = None
    in_flight: float = 0.0
    arrival_rate: float | None = None
    service_time_ms: float | None = None


def replay_autoscale(
    ticks: Sequence[Tick], config: autoscale.AutoscaleConfig, *, start: int = 1, slo_ms: float = 50.0,
    dt: float = 1.0, t0: float = 0.0,
) -> list[autoscale.ScaleDecision]:
    state = autoscale.AutoscaleState()
    current = start
    out = []
    for i, tick in enumerate(ticks):
        ctx = autoscale.AutoscaleContext(
            now=t0 + i * dt, current_replicas=current, slo_latency_ms=slo_ms, latency_ms=tick.latency_ms,
            in_flight=tick.in_flight, arrival_rate=tick.arrival_rate, service_time_ms=tick.service_time_ms,
            config=config, state=state,
        )
        decision, state = autoscale.decide(ctx)
        current = decision.replicas
        out.append(decision)
    return out


def replay_hpa(
    metrics: Sequence[float], config: hpa.HpaConfig, *, start: int = 1, dt: float = 15.0,
) -> list[hpa.HpaDecision]:
    state = hpa.HpaState()
    current = start
    out = []
    for i, m in enumerate(metrics):
        decision, state = hpa.decide(hpa.HpaContext(now=i * dt, current_replicas=current, metric=m,
                                                    config=config, state=state))
        current = decision.replicas
        out.append(decision)
    return out


def replicas(decisions: Sequence[Any]) -> list[int]:
    return [d.replicas for d in decisions]


def with_guard(config: autoscale.AutoscaleConfig, **kw: Any) -> autoscale.AutoscaleConfig:
    return replace(config, guardrails=replace(config.guardrails, **kw))
