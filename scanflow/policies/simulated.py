"""What the scaling policies see in a simulation: the Checker's observations, windowed, delayed and noisy.

Why its own module: a simulated comparison of the Planner with the HPA means something only if the
Planner gets what the deployed agents really send (scanflow.agentkit.observe, `latency.checked`) and
nothing more: never the trace's true rate or the model's service time. The S2 benchmark
(benchmarks/scaling.py, a request-level queue) and the demo's comparison (scanflow/demo/sim.py, a
fluid queue) simulate different systems but observe them with this one model, and drive the policies
through the same controllers, so both stay in step with the agents.

The observation model, per Checker interval (1 s nominal):
- WINDOWED: rates and CPU figures over the interval (arrivals / interval, CPU per request answered,
  CPU used over the replicas' limits), the p99 of the requests answered in it as the gateway's
  histogram gives it (the upper bound of its bucket; past the top bucket, that bound as a lower bound);
- DELAYED: a controller decides on the interval before last (scrape, forward, decide: `Observer.view`);
- NOISY: the rates and CPU figures carry a lognormal error (sd `noise`, 10%), as two scrapes taken a
  few milliseconds apart from the gateway and the replicas do; the p99, the queue and throttling do not.
The HPA averages the same delayed CPU utilization over its own sync period (`hpa_controller`).

Who calls: benchmarks/scaling.py, scanflow/demo/sim.py, tests/policies.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from scanflow.policies import elastic, hpa
from scanflow.serving.server import LATENCY_BUCKETS

BUCKETS_MS = [b * 1000.0 for b in LATENCY_BUCKETS]
TICK_S = 1.0  # the Checker's interval, nominal
# the S2 load step, (seconds, requests/s) nominal: 1 ms of CPU per request makes it 0.6 -> 3.6 -> 0.6 cores
STEP_TRACE = ((60.0, 600.0), (120.0, 3600.0), (360.0, 600.0))
DELAY_INTERVALS = 1  # a controller sees the interval before last


@dataclass(frozen=True)
class Observation:
    """One interval as the Checker reports it (fields of `latency.checked`)."""

    p99_ms: float | None
    p99_lower_bound: bool
    in_flight: float
    arrival_rate: float
    cpu_per_request_ms: float | None
    cpu_utilization: float | None
    throttled_ratio: float | None
    headroom_cores_per_replica: float


@dataclass(frozen=True)
class View:
    """What a controller gets at a tick: its own present size and the (delayed) observations."""

    now: float
    replicas: int
    ready: int
    cpu: float
    obs: Observation | None  # the interval before last (None at the very start)
    recent: tuple[Observation, ...]  # every delayed observation so far, newest last (the HPA averages)


Controller = Callable[[View], tuple[int, float]]  # -> (replicas, cores per replica)


def bucketed(p_ms: float) -> tuple[float, bool]:
    """The gateway histogram's answer for a latency: its bucket's upper bound, or the top bound + above."""
    i = bisect.bisect_left(BUCKETS_MS, p_ms - 1e-9)
    return (BUCKETS_MS[i], False) if i < len(BUCKETS_MS) else (BUCKETS_MS[-1], True)


def throttled_share(used: float, cpu: float) -> float:
    """Share of CFS periods (100 ms) a replica is throttled in, a stand-in for the kernel's count: none
    while its mean use stays under 80% of its quota, then rising linearly to every period at 100% (with
    ~1 ms requests a period holds tens of them, so the use within one period stays near the mean)."""
    util = min(1.0, used / cpu) if cpu > 0 else 1.0
    return min(1.0, max(0.0, (util - 0.8) / 0.2))


@dataclass
class Observer:
    """The Checker of a simulation: turns each interval's true figures into an `Observation` (windowed,
    noisy) and hands controllers the delayed one. `seed` fixes the measurement noise."""

    noise: float = 0.1
    seed: int = 0
    history: list[Observation] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.noise < 0 or not math.isfinite(self.noise):
            raise ValueError(f"noise must be a finite sd >= 0, got {self.noise}")
        self._rng = np.random.default_rng(10_000 + self.seed)

    def noisy(self, x: float) -> float:
        return float(x * math.exp(self._rng.normal(0.0, self.noise))) if self.noise > 0 else x

    def observe(self, *, interval_s: float, arrivals: float, p99_ms: float | None, in_flight: float,
                cpu_per_request_ms: float | None, cpu_used_s: float, cpu_capacity_s: float,
                throttled: list[float], headroom_cores_per_replica: float) -> Observation:
        """Record one interval: `arrivals` (requests that arrived in it), the true p99 of those answered in
        it (None: none answered), the requests in flight at its end, the true mean CPU per request answered
        (ms, None: none answered), the CPU used and the cores allotted to the ready replicas (core-seconds),
        each ready replica's throttled share, the headroom per replica (node cores not allotted)."""
        p99, above = (None, False) if p99_ms is None else bucketed(p99_ms)
        obs = Observation(
            p99_ms=p99, p99_lower_bound=above, in_flight=float(in_flight),
            arrival_rate=self.noisy(arrivals / interval_s),
            cpu_per_request_ms=None if cpu_per_request_ms is None else self.noisy(cpu_per_request_ms),
            cpu_utilization=min(1.0, self.noisy(cpu_used_s / cpu_capacity_s)) if cpu_capacity_s > 0 else None,
            throttled_ratio=max(throttled) if throttled else None,
            headroom_cores_per_replica=headroom_cores_per_replica,
        )
        self.history.append(obs)
        return obs

    def view(self, now: float, replicas: int, ready: int, cpu: float) -> View:
        """What a controller may read now: the observation DELAY_INTERVALS before the latest, and the
        delayed ones before it."""
        seen = self.history[: max(0, len(self.history) - DELAY_INTERVALS)]
        return View(now=now, replicas=replicas, ready=ready, cpu=cpu, obs=seen[-1] if seen else None,
                    recent=tuple(seen))


def elastic_controller(slo_ms: float, max_replicas: int, time_scale: float, node_cpus: float, *,
                       vertical: bool, min_replicas: int = 1,
                       config: elastic.ElasticConfig | None = None) -> Controller:
    """The Planner's policy (scanflow.policies.elastic) with its shipped defaults (the digits workflow's
    settings) unless `config` is given; the bounds, the time scale and vertical on/off are the caller's.
    It reads only the delayed observation."""
    base = config or elastic.ElasticConfig()
    scale = replace(base.scale, guardrails=replace(base.scale.guardrails, min_replicas=min_replicas,
                                                   max_replicas=max_replicas, time_scale=time_scale))
    cfg = replace(base, scale=scale, vertical=vertical)
    state = elastic.ElasticState()

    def step(v: View) -> tuple[int, float]:
        nonlocal state
        o = v.obs
        if o is None:
            return v.replicas, v.cpu
        d, state = elastic.decide(elastic.ElasticContext(
            now=v.now, current_replicas=v.replicas, ready_replicas=v.ready, cpu=v.cpu, slo_latency_ms=slo_ms,
            latency_ms=o.p99_ms, latency_lower_bound=o.p99_lower_bound, in_flight=o.in_flight,
            arrival_rate=o.arrival_rate, cpu_per_request_ms=o.cpu_per_request_ms,
            cpu_utilization=o.cpu_utilization, throttled_ratio=o.throttled_ratio, node_cpus=node_cpus,
            headroom_cores_per_replica=o.headroom_cores_per_replica, config=cfg, state=state))
        return d.replicas, d.cpu

    return step


def hpa_controller(max_replicas: int, time_scale: float, *, min_replicas: int = 1, target: float = 0.7,
                   tick_s: float = TICK_S) -> Controller:
    """The HPA algorithm (scanflow.policies.hpa) on the replicas' CPU utilization, averaged over its sync
    period from the same delayed observations; it never resizes."""
    cfg = hpa.HpaConfig(min_replicas=min_replicas, max_replicas=max_replicas, target=target, time_scale=time_scale)
    period = max(1, round(cfg.sync_period_s / tick_s))
    state = hpa.HpaState()

    def step(v: View) -> tuple[int, float]:
        nonlocal state
        window = [o.cpu_utilization for o in v.recent[-period:] if o.cpu_utilization is not None]
        metric = sum(window) / len(window) if window else 0.0
        d, state = hpa.decide(hpa.HpaContext(now=v.now, current_replicas=v.replicas, ready_replicas=v.ready,
                                             metric=metric, config=cfg, state=state))
        return d.replicas, v.cpu

    return step


def count_flaps(events: list[tuple[float, float, float]], window_s: float) -> int:
    """Capacity moves (time, cores before, cores after): a move followed, within `window_s`, by a move in
    the opposite direction."""
    flaps = 0
    for (t1, a1, b1), (t2, a2, b2) in itertools.pairwise(events):
        if (b1 - a1) * (b2 - a2) < 0 and t2 - t1 < window_s:
            flaps += 1
    return flaps
