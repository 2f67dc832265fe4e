"""S2's side-by-side comparison: the Planner's scaling policy vs the Kubernetes HPA algorithm, simulated.

Both controllers (scanflow.policies.elastic vertical-first, as the digits workflow's Planner runs it,
and scanflow.policies.hpa, the baseline) drive the same fluid queue model on the same load trace, tick
by tick, with real Kubernetes timings (15 s HPA sync, 300 s scale-down stabilisation) and the same
`time_scale` for both. A real run with these timings would take many minutes per controller on a
2-core machine, so the comparison is simulated; the real-platform part of S2
(scanflow.demo.s2_autoscale) shows the Planner on real processes.

What the controllers see is what the deployed agents send, through the observation model the S2
benchmark uses (scanflow.policies.simulated): each Checker interval's arrival rate, CPU per request,
CPU utilization, throttling, requests in flight, the node's unallocated cores and the p99 as the
gateway's histogram gives it, one interval late, with a 10% lognormal error on the rates and CPU
figures (`noise`, seeded). Never the trace's rate of the moment nor the model's service time.

The model: a replica given c cores serves `mu`·c requests/s (ceil(c) threads at speed c/ceil(c), so
its service time is 1000/mu·ceil(c)/c ms); arrivals beyond the ready replicas' capacity queue (one
shared backlog, the gateway's); latency = queueing + service time (a fluid model: its p99 is its
mean); a new replica is ready after `cold_start_s`, an in-place resize lands after `resize_s`; each
replica has a node of `node_cpus` to itself (its vertical ceiling). Throttling follows the use of the
quota (scanflow.policies.simulated.throttled_share). benchmarks/scaling.py runs the same controllers
and observations on a request-level queue with Poisson arrivals over several seeds.
Who calls: s2_autoscale, s2_inprocess, tests/demo.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from scanflow.policies import simulated
from scanflow.spec import SLO

SLO_DEFAULT_MS = float(SLO.model_fields["latency_ms"].default)

CONTROLLERS = ("planner", "horizontal", "hpa")
FLAP_WINDOW_S = 60.0


@dataclass(frozen=True)
class Trace:
    """Arrival rate (requests/s) by phase: ((duration_s, rate), ...)."""

    phases: tuple[tuple[float, float], ...] = simulated.STEP_TRACE

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
    mu: float = 1000.0  # requests/s one core serves (1 ms of CPU per request)
    cold_start_s: float = 10.0
    resize_s: float = 2.0
    slo_ms: float = SLO_DEFAULT_MS  # the workflow's default SLO (scanflow.spec)
    min_replicas: int = 1
    max_replicas: int = 8
    declared_cpu: float = 1.0  # cores per replica at the start (the HPA's replicas keep it)
    node_cpus: float = 8.0
    noise: float = 0.1
    seed: int = 0
    dt: float = 1.0
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.mu <= 0 or self.dt <= 0 or self.time_scale <= 0 or self.declared_cpu <= 0 or self.node_cpus <= 0:
            raise ValueError("mu, dt, time_scale, declared_cpu and node_cpus must be > 0")
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError("need 1 <= min_replicas <= max_replicas")


@dataclass
class SimResult:
    name: str
    t: list[float] = field(default_factory=list)
    replicas: list[int] = field(default_factory=list)
    cores: list[float] = field(default_factory=list)  # cores allocated in all (replicas x cores each)
    latency_ms: list[float] = field(default_factory=list)
    violation_s: float = 0.0  # seconds with latency above the SLO
    replica_s: float = 0.0  # cost: replica-seconds
    core_s: float = 0.0  # cost: core-seconds allocated
    changes: int = 0  # capacity moves (scale or resize)
    reversals: int = 0  # direction changes of the capacity
    flaps: int = 0  # a move followed within 60 s (nominal) by one the other way
    max_replicas: int = 0
    max_cpu: float = 0.0  # the most cores one replica had
    time_to_meet_slo_s: float | None = None  # after the step up, until latency is back under the SLO

    def figures(self) -> dict[str, float | int | None]:
        return {"slo_violation_s": round(self.violation_s, 1), "replica_s": round(self.replica_s, 1),
                "core_s": round(self.core_s, 1), "scale_actions": self.changes, "reversals": self.reversals,
                "flaps": self.flaps, "max_replicas": self.max_replicas, "max_cpu": self.max_cpu,
                "time_to_meet_slo_s": self.time_to_meet_slo_s}


@dataclass
class _Replica:
    cpu: float
    ready_at: float
    # resizes asked and not landed yet, (lands at, new cores) in order: each lands `resize_s` after its
    # plan, a later plan never postpones an earlier one (the Executor applies them one after the other)
    pending: list[tuple[float, float]] = field(default_factory=list)


def _controller(name: str, cfg: SimConfig) -> simulated.Controller:
    if name == "hpa":
        return simulated.hpa_controller(cfg.max_replicas, cfg.time_scale, min_replicas=cfg.min_replicas,
                                        tick_s=cfg.dt)
    return simulated.elastic_controller(cfg.slo_ms, cfg.max_replicas, cfg.time_scale, cfg.node_cpus,
                                        vertical=name == "planner", min_replicas=cfg.min_replicas)


def simulate(controller: str, trace: Trace, cfg: SimConfig = SimConfig()) -> SimResult:
    """Run 'planner' (vertical-first), 'horizontal' (the same policy, replicas only) or 'hpa' on the
    trace; time in (scaled) seconds. Deterministic for a given `cfg.seed`."""
    if controller not in CONTROLLERS:
        raise ValueError(f"controller must be one of {CONTROLLERS} ('planner' is vertical-first), got {controller!r}")
    ts = cfg.time_scale
    decide = _controller(controller, cfg)
    observer = simulated.Observer(noise=cfg.noise, seed=cfg.seed)
    res = SimResult(controller)
    reps = [_Replica(cfg.declared_cpu, 0.0) for _ in range(cfg.min_replicas)]
    target = cfg.declared_cpu
    backlog = 0.0
    last_dir = 0
    moves: list[tuple[float, float, float]] = []
    step_at = trace.phases[0][0] / ts
    n_ticks = math.ceil(trace.duration / ts / cfg.dt - 1e-9)
    for k in range(n_ticks):
        t, t_end = k * cfg.dt, (k + 1) * cfg.dt
        for r in reps:  # resizes that landed by now
            while r.pending and r.pending[0][0] <= t + 1e-12:
                r.cpu = r.pending.pop(0)[1]
        ready = [r for r in reps if r.ready_at <= t + 1e-12]
        rate = trace.rate(t * ts)
        cores_ready = sum(r.cpu for r in ready)
        cap = cores_ready * cfg.mu  # requests/s
        served = min(cap * cfg.dt, backlog + rate * cfg.dt)
        backlog = max(0.0, backlog + rate * cfg.dt - served)
        # a request's service time on the ready replicas (the slowest thread speed of any of them)
        service_ms = 1000.0 / cfg.mu * max((math.ceil(r.cpu - 1e-9) / r.cpu for r in ready), default=1.0)
        latency = (backlog / cap * 1000.0 if cap else 1e4) + service_ms
        used = served / cfg.mu  # core-seconds
        observer.observe(
            interval_s=cfg.dt, arrivals=rate * cfg.dt, p99_ms=latency if served > 0 else None,
            in_flight=backlog + min(rate, cap) * service_ms / 1000.0,
            cpu_per_request_ms=1000.0 / cfg.mu if served > 0 else None, cpu_used_s=used,
            cpu_capacity_s=cores_ready * cfg.dt,
            throttled=[simulated.throttled_share(used * r.cpu / cores_ready / cfg.dt, r.cpu) for r in ready],
            headroom_cores_per_replica=max(0.0, cfg.node_cpus - max((r.cpu for r in ready), default=0.0)))
        res.t.append(t)
        res.replicas.append(len(reps))
        res.cores.append(sum(r.cpu for r in reps))
        res.latency_ms.append(latency)
        if latency > cfg.slo_ms:
            res.violation_s += cfg.dt * ts
        elif t >= step_at and res.time_to_meet_slo_s is None and res.violation_s > 0:
            res.time_to_meet_slo_s = round((t - step_at) * ts, 1)
        res.replica_s += len(reps) * cfg.dt * ts
        res.core_s += sum(r.cpu for r in reps) * cfg.dt * ts
        want_r, want_cpu = decide(observer.view(t_end, len(reps), len(ready), target))
        want_r = max(cfg.min_replicas, min(cfg.max_replicas, want_r))
        before = len(reps) * target
        if want_cpu != target:
            for r in reps:
                if r.ready_at <= t_end:
                    r.pending.append((t_end + cfg.resize_s / ts, want_cpu))
                else:  # still starting: it starts with the new size
                    r.cpu = want_cpu
            target = want_cpu
        if want_r > len(reps):
            reps += [_Replica(target, t_end + cfg.cold_start_s / ts) for _ in range(want_r - len(reps))]
        elif want_r < len(reps):  # replicas still starting go first, then the newest
            reps = sorted(reps, key=lambda r: r.ready_at)[:want_r]
        after = len(reps) * target
        if abs(after - before) > 1e-9:
            direction = 1 if after > before else -1
            res.changes += 1
            res.reversals += int(last_dir != 0 and direction != last_dir)
            last_dir = direction
            moves.append((t_end, before, after))
        res.max_replicas = max(res.max_replicas, len(reps))
        res.max_cpu = max(res.max_cpu, target)
    res.flaps = simulated.count_flaps(moves, FLAP_WINDOW_S / ts)
    return res


def compare(trace: Trace = Trace(), cfg: SimConfig = SimConfig(),
            controllers: tuple[str, ...] = ("planner", "hpa")) -> dict[str, SimResult]:
    """The controllers on the same trace, model and measurement noise."""
    return {name: simulate(name, trace, cfg) for name in controllers}
