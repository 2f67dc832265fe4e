"""S2's side-by-side comparison: the Planner's autoscale policy vs the Kubernetes HPA algorithm, simulated.

Both controllers (scanflow.policies.autoscale and .hpa, the very functions the Planner and the
baseline use) drive the same fluid queue model on the same load trace, tick by tick, with real
Kubernetes timings (15 s HPA sync, 300 s scale-down stabilisation) and the same `time_scale` for both.
A real run with these timings would take many minutes per controller on a 2-core machine, so the
comparison is simulated; the real-platform part of S2 (scanflow.demo.s2_autoscale) shows the Planner
on real processes. The model: each ready replica serves `mu` requests/s; arrivals beyond capacity
queue; latency = queueing + service time; a new replica is ready after `cold_start_s`. HPA sees CPU
utilisation (busy share of the ready replicas, capped at 1), the Planner what the Checker measures
(latency, in flight, arrival rate, service time per request) one interval late, as the deployed loop
sees it: never the trace's rate of the moment. Pure and deterministic; benchmarks/scaling.py adds
measurement noise, the vertical-first policy and a request-level model. Who calls: s2_autoscale, tests/demo.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from scanflow.policies import autoscale, hpa
from scanflow.policies.guardrails import Guardrails


@dataclass(frozen=True)
class Trace:
    """Arrival rate (requests/s) by phase: ((duration_s, rate), ...)."""

    phases: tuple[tuple[float, float], ...] = ((60.0, 300.0), (300.0, 2400.0), (600.0, 300.0))

    def rate(self, t: float) -> float:
        end = 0.0
        for dur, r in self.phases:
            end += dur
            if t < end:
                return r
        return self.phases[-1][1]

    @property
    def duration(self) -> float:
        return sum(d for d, _ in self.phases)


@dataclass(frozen=True)
class SimConfig:
    mu: float = 1000.0  # requests/s one replica serves
    cold_start_s: float = 10.0
    slo_ms: float = 50.0
    min_replicas: int = 1
    max_replicas: int = 8
    dt: float = 1.0
    time_scale: float = 1.0


@dataclass
class SimResult:
    name: str
    t: list[float] = field(default_factory=list)
    replicas: list[int] = field(default_factory=list)
    latency_ms: list[float] = field(default_factory=list)
    violation_s: float = 0.0  # seconds with latency above the SLO
    replica_s: float = 0.0  # cost: replica-seconds
    changes: int = 0  # scale actions
    reversals: int = 0  # direction changes (flapping)
    time_to_meet_slo_s: float | None = None  # after the step up, until latency is back under the SLO

    def figures(self) -> dict[str, float | int | None]:
        return {"slo_violation_s": round(self.violation_s, 1), "replica_s": round(self.replica_s, 1),
                "scale_actions": self.changes, "reversals": self.reversals,
                "time_to_meet_slo_s": self.time_to_meet_slo_s}


def _planner(cfg: SimConfig) -> autoscale.AutoscaleConfig:
    return autoscale.AutoscaleConfig(guardrails=Guardrails(
        min_replicas=cfg.min_replicas, max_replicas=cfg.max_replicas, up_ticks=1, down_ticks=5,
        down_delay_s=30.0, cooldown_down_s=60.0, max_step_down=1, cold_start_s=30.0,
        time_scale=cfg.time_scale))


def simulate(controller: str, trace: Trace, cfg: SimConfig = SimConfig()) -> SimResult:
    """Run 'planner' or 'hpa' on the trace; time in (scaled) seconds."""
    if controller not in ("planner", "hpa"):
        raise ValueError(f"controller must be 'planner' or 'hpa', got {controller!r}")
    res = SimResult(controller)
    pcfg = _planner(cfg)
    hcfg = hpa.HpaConfig(min_replicas=cfg.min_replicas, max_replicas=cfg.max_replicas, target=0.7,
                         time_scale=cfg.time_scale)
    pstate, hstate = autoscale.AutoscaleState(), hpa.HpaState()
    replicas = cfg.min_replicas
    starting: list[float] = []  # ready times of replicas being started
    backlog = 0.0
    last_dir = 0
    seen: tuple[float, float, float] | None = None  # the last interval's (latency, in flight, rate), as measured
    step_at = trace.phases[0][0] / cfg.time_scale
    duration = trace.duration / cfg.time_scale
    t = 0.0
    while t < duration:
        starting = [r for r in starting if r > t]
        ready = replicas - len(starting)
        rate = trace.rate(t * cfg.time_scale)
        cap = max(ready, 0) * cfg.mu
        backlog = max(0.0, backlog + (rate - cap) * cfg.dt)
        service_ms = 1000.0 / cfg.mu
        latency = (backlog / cap * 1000.0 if cap else 1e4) + service_ms
        util = min(1.0, rate / cap) if cap else 1.0
        d: autoscale.ScaleDecision | hpa.HpaDecision
        if controller == "planner":
            # what the Checker sends: the interval before this one (scrape, forward, decide), measured
            # at the gateway and the replicas; the trace's own rate is never read here
            d, pstate = autoscale.decide(autoscale.AutoscaleContext(
                now=t, current_replicas=replicas, ready_replicas=ready, slo_latency_ms=cfg.slo_ms,
                latency_ms=seen[0] if seen else None, in_flight=seen[1] if seen else 0.0,
                arrival_rate=seen[2] if seen else None, service_time_ms=service_ms if seen else None,
                config=pcfg, state=pstate))
        else:
            d, hstate = hpa.decide(hpa.HpaContext(now=t, current_replicas=replicas, ready_replicas=ready,
                                                  metric=util, config=hcfg, state=hstate))
        seen = (latency, backlog + rate * service_ms / 1000.0, rate)
        target = d.replicas
        if target != replicas:
            direction = 1 if target > replicas else -1
            res.changes += 1
            res.reversals += int(last_dir != 0 and direction != last_dir)
            last_dir = direction
            if target > replicas:
                starting += [t + cfg.cold_start_s / cfg.time_scale] * (target - replicas)
            else:
                starting = starting[: max(0, len(starting) - (replicas - target))]
            replicas = target
        res.t.append(t)
        res.replicas.append(replicas)
        res.latency_ms.append(latency)
        if latency > cfg.slo_ms:
            res.violation_s += cfg.dt
        elif t >= step_at and res.time_to_meet_slo_s is None and res.violation_s > 0:
            res.time_to_meet_slo_s = round(t - step_at, 1)
        res.replica_s += replicas * cfg.dt
        t += cfg.dt
    if not math.isfinite(res.violation_s):  # pragma: no cover - defensive
        res.violation_s = float("inf")
    return res


def compare(trace: Trace = Trace(), cfg: SimConfig = SimConfig()) -> dict[str, SimResult]:
    """Both controllers on the same trace and model."""
    return {name: simulate(name, trace, cfg) for name in ("planner", "hpa")}
