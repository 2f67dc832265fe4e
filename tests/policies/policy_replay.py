"""Replay scripted tick sequences through a policy (helpers of the policies tests).

The loop here plays the Planner's part: it owns the clock, feeds each tick's metrics in, applies the
decided replica count immediately, and carries the state from one tick into the next.
"""

from __future__ import annotations

import itertools
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


@dataclass(frozen=True)
class Obs:
    """One `latency.checked` observation for the elastic policy (the fields the Checker sends)."""

    latency_ms: float | None = 10.0
    in_flight: float = 1.0
    arrival_rate: float | None = None
    cpu_per_request_ms: float | None = 1.0
    cpu_utilization: float | None = None
    throttled_ratio: float | None = 0.0
    headroom_cores_per_replica: float | None = None


def replay_elastic(
    ticks: Sequence[Obs], config: Any, *, start: int = 1, cpu: float = 1.0, slo_ms: float = 50.0,
    node_cpus: float = 8.0, dt: float = 1.0, delay: int = 0,
) -> list[Any]:
    """Play the Planner: each tick decides on the observation `delay` ticks old (the Checker's scrape,
    forward and decide) and applies replicas and cores at once. A missing headroom is the node's CPUs
    less the cores given (one replica per node)."""
    from scanflow.policies import elastic

    state = elastic.ElasticState()
    replicas, cores = start, cpu
    out = []
    for i in range(len(ticks)):
        o = ticks[max(0, i - delay)]
        head = o.headroom_cores_per_replica
        ctx = elastic.ElasticContext(
            now=i * dt, current_replicas=replicas, cpu=cores, slo_latency_ms=slo_ms, latency_ms=o.latency_ms,
            in_flight=o.in_flight, arrival_rate=o.arrival_rate, cpu_per_request_ms=o.cpu_per_request_ms,
            cpu_utilization=o.cpu_utilization, throttled_ratio=o.throttled_ratio, node_cpus=node_cpus,
            headroom_cores_per_replica=max(0.0, node_cpus - cores) if head is None else head,
            config=config, state=state)
        decision, state = elastic.decide(ctx)
        replicas, cores = decision.replicas, decision.cpu
        out.append(decision)
    return out


def capacity_flaps(decisions: Sequence[Any], window: float = 60.0, dt: float = 1.0) -> int:
    """Moves of the total cores (replicas x cores) followed within `window` by one the other way."""
    moves = []
    for i, d in enumerate(decisions):
        before, after = d.current * d.current_cpu, d.replicas * d.cpu
        if abs(after - before) > 1e-9:
            moves.append((i * dt, after - before))
    return sum(1 for (t1, a), (t2, b) in itertools.pairwise(moves) if a * b < 0 and t2 - t1 < window)
