"""S2's capacity and SLO arithmetic, pure: the calibration ramp's rates, one replica's capacity at its
CPU limit from that ramp, a smaller limit when the generator cannot overload the replica, the load step's
rates and the SLO the Checker holds for the run. Separate from the scenario (scanflow.demo.s2_autoscale)
and from its measurements on the stack (scanflow.demo.s2_stack) because it is plain numbers in and out,
shared with S3 and the tuning benchmark and tested without a stack.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

SLO_MS = 50.0  # the digits service's SLO (p99)
SLO_BASELINE_FACTOR = 2.0  # the histogram buckets grow ~2-2.5x: over the SLO = 2 buckets above the baseline
SLO_CAP_MS = 70.0  # under the ~100 ms an overloaded replica reaches: the 75 ms bucket is over it
LOW_BAND_MARGIN = 1.5  # the low-load p99 sits this far under the scale-down band (latency_low x SLO)
LOW_FRACTION, HIGH_FRACTION = 0.25, 2.5  # of one replica's measured capacity
MIN_REPLICA_CPU = 0.05  # the smallest limit `fitted_cpu` sets (a CFS quota of 5 ms per 100 ms period)
MAX_RATE = 400.0  # requests/s: above this the gateway and the generator share the 2 cores with the replicas
SATURATED = 0.85  # a replica using this share of its CPU limit is at its capacity (throttled next)


@dataclass(frozen=True)
class Rates:
    """The load step, requests/s, from one replica's measured capacity at its CPU limit."""

    capacity: float
    low: float
    high: float


def probe_rates(start: float, factor: float = 1.6, n: int = 9) -> list[float]:
    """Pure: the calibration ramp, requests/s (start, start * factor, ...), capped at MAX_RATE."""
    return sorted({round(min(MAX_RATE, start * factor**k), 1) for k in range(n)})


def capacity(points: Sequence[tuple[float, float, float | None]], cpu_limit: float,
             slo_ms: float = SLO_MS) -> float | None:
    """Pure: one replica's capacity at `cpu_limit` cores from a ramp of (rate, CPU cores it used, gateway
    p99 ms): the rate where it first used SATURATED of its limit (interpolated between the two points
    around it), or, on a machine too busy to give the replica its limit, the last rate before the gateway
    p99 went over the SLO at two rates in a row (one breach alone is the busy machine's noise: measured,
a 150 ms p99 at 10 rps on a machine with a core burned, then nothing); past the ramp's end, the last point's rate scaled to the limit. Why measured
    and not `limit / CPU per request`: the gateway coalesces requests into batches that grow with the
    load, so a request costs less at a high rate than at a low one (measured here: the batch-1 estimate
    was ~half the real knee)."""
    target = SATURATED * cpu_limit
    prev: tuple[float, float] | None = None
    ramp = sorted(points)
    for i, (rate, cpu, p99) in enumerate(ramp):
        if cpu >= target:
            if prev is None or cpu <= prev[1]:
                return rate
            r0, c0 = prev
            return round(r0 + (rate - r0) * (target - c0) / (cpu - c0), 1)
        if over_slo(p99, slo_ms) and (i + 1 == len(ramp) or over_slo(ramp[i + 1][2], slo_ms)):
            return prev[0] if prev is not None else rate  # a breach the next rate confirms (or the last)
        prev = (rate, cpu)
    if prev is None or prev[1] <= 0:
        return None
    return round(prev[0] * target / prev[1], 1)


def fitted_cpu(points: Sequence[tuple[float, float, float | None]], cpu_limit: float) -> float | None:
    """Pure: a smaller CPU limit for the scenario when the step the generator can send (at most MAX_RATE)
    is less than HIGH_FRACTION x the replica's capacity at `cpu_limit`: a Planner that rightly holds would
    then fail the scenario. Two cases, one rule. The ramp reached MAX_RATE with the replica under
    SATURATED of its limit (measured with a core burned: 400 rps at 0.25 core used ~0.14 core, p99 under
    the SLO, no move); or it saturated just under MAX_RATE (measured while a package install ran beside
    it: ~360 rps at 0.25 core, so the step was capped at 400 rps, 1.1x capacity, and never broke the SLO).
    The limit is scaled so that MAX_RATE is HIGH_FRACTION x the capacity there (capacity taken as
    proportional to the limit; the smaller batches of a slower replica cost more per request, so the
    step is a little more than that), never under MIN_REPLICA_CPU. None when the step already overloads
    the replica enough, or when the ramp stopped before either end (no capacity to scale from)."""
    if not points:
        return None
    rate, used, _ = max(points)
    if rate < MAX_RATE and used < SATURATED * cpu_limit:
        return None
    cap = capacity(points, cpu_limit, slo_ms=math.inf)
    if cap is None or HIGH_FRACTION * cap <= MAX_RATE:
        return None
    return min(cpu_limit, max(MIN_REPLICA_CPU, round(cpu_limit * MAX_RATE / (HIGH_FRACTION * cap), 2)))


def over_slo(p99: float | None, slo_ms: float) -> bool:
    return p99 is not None and p99 > slo_ms


def rates(cap: float | None) -> Rates | None:
    """Pure: the step's rates from one replica's capacity: LOW_FRACTION of it, then HIGH_FRACTION (more than
    one replica serves, less than the maximum), capped at MAX_RATE. None without a usable capacity."""
    if cap is None or not cap > 0:
        return None
    return Rates(round(cap, 1), round(max(5.0, LOW_FRACTION * cap), 1), round(min(MAX_RATE, HIGH_FRACTION * cap), 1))


def calibrated_slo(baseline_p99_ms: float | None, latency_low: float = 0.6,
                   worst_p99_ms: float | None = None) -> float:
    """The SLO the Checker holds for the run: the service's 50 ms, or 2x the p99 measured at low load when
    the machine is busier than that (a shared 2-core box), so 'over the SLO' still means 'overloaded';
    that part never above SLO_CAP_MS: an overloaded replica's p99 settles near one CFS period (100 ms:
    the gateway coalesces requests, so its batches grow instead of its queue), and an SLO at or above
    that hid the overload from a latency-only policy (measured: a 100 ms SLO, step p99 50-86 ms, no
    scale-up). But never so low that the low-load p99 (its worst second, `worst_p99_ms`) sits above the
    policy's scale-down band (`latency_low` x SLO, with LOW_BAND_MARGIN): on a busy machine (a core
    burned) a 70 ms cap put that band at 42 ms, under the 40-60 ms the service answered at the low rate,
    and the Planner never scaled down; with the band at 1.25x the median, one noisy second a few times a
    minute kept its 20 s down window from ever clearing. The Planner sees an overload in its
    observations too (arrival rate x CPU per request over the replicas' capacity), so the higher SLO
    still scales up."""
    if baseline_p99_ms is None:
        return SLO_MS
    two_x = min(SLO_CAP_MS, SLO_BASELINE_FACTOR * baseline_p99_ms)
    worst = max(baseline_p99_ms, worst_p99_ms or 0.0)
    return round(max(SLO_MS, two_x, LOW_BAND_MARGIN * worst / latency_low), 1)


def median(values: Sequence[float]) -> float | None:
    xs = sorted(values)
    return None if not xs else (xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2)
